package kubecache_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestManagerCachesOnlyWhatCoderK8sOwns builds a manager as the
// composition root does and watches what the controllers watch
// (Deployments, Secret metadata, CoderControlPlanes), against a real
// kube-apiserver holding objects of others next to the operator's.
func TestManagerCachesOnlyWhatCoderK8sOwns(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx := t.Context()
	const ns = "tenant"
	if err := k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]string{coderv1alpha1.LabelManagedBy: coderv1alpha1.ManagedByValue}
	// What `kubectl apply` leaves: the whole object, data included.
	lastApplied := map[string]string{kubecache.LastAppliedAnnotation: `{"data":{"password":"aHVudGVyMg=="}}`, "keep": "me"}
	deployment := func(name string, labels map[string]string) *appsv1.Deployment {
		sel := map[string]string{"app": name}
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: lastApplied},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: sel},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
				},
			},
		}
	}
	secret := func(name string, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: lastApplied},
			Data:       map[string][]byte{"password": []byte("hunter2")},
		}
	}
	for _, o := range []client.Object{
		deployment("theirs", nil),
		deployment("ours", ours),
		secret("their-secret", nil),
		secret("our-secret", ours),
		&coderv1alpha1.CoderControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coder"},
			Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: "https://coder.example.com"},
		},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	mgr, err := ctrl.NewManager(k.Config, ctrl.Options{
		Scheme:                 scheme.New(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  kubecache.Options(),
		Client:                 kubecache.ClientOptions(),
	})
	if err != nil {
		t.Fatal(err)
	}
	secretMeta := &metav1.PartialObjectMetadata{}
	secretMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	informers := map[string]cache.Informer{}
	for what, obj := range map[string]client.Object{"Deployment": &appsv1.Deployment{}, "Secret": secretMeta, "CoderControlPlane": &coderv1alpha1.CoderControlPlane{}} {
		inf, err := mgr.GetCache().GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil {
			t.Fatal(err)
		}
		informers[what] = inf
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("cache did not sync")
	}

	// The stores hold only the operator's objects (and its own kinds).
	for what, want := range map[string][]string{
		"Deployment":        {ns + "/ours"},
		"Secret":            {ns + "/our-secret"},
		"CoderControlPlane": {ns + "/coder"},
	} {
		inf, ok := informers[what].(toolscache.SharedIndexInformer)
		if !ok {
			t.Fatalf("%s informer is a %T, not a client-go SharedIndexInformer", what, informers[what])
		}
		if got := inf.GetStore().ListKeys(); len(got) != len(want) || got[0] != want[0] {
			t.Errorf("%s informer holds %v, want %v", what, got, want)
		}
	}

	cached := mgr.GetCache()
	err = cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: "theirs"}, &appsv1.Deployment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("cache Get of someone else's Deployment = %v, want NotFound", err)
	}
	var dep appsv1.Deployment
	if err := cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ours"}, &dep); err != nil {
		t.Fatalf("cache Get of the operator's Deployment: %v", err)
	}
	checkStripped(t, "Deployment ours", &dep)
	theirMeta := secretMeta.DeepCopy()
	err = cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: "their-secret"}, theirMeta)
	if !apierrors.IsNotFound(err) {
		t.Errorf("cache Get of someone else's Secret metadata = %v, want NotFound", err)
	}
	ourMeta := secretMeta.DeepCopy()
	if err := cached.Get(ctx, client.ObjectKey{Namespace: ns, Name: "our-secret"}, ourMeta); err != nil {
		t.Fatalf("cache Get of the operator's Secret metadata: %v", err)
	}
	checkStripped(t, "Secret our-secret", ourMeta)

	// The manager's client reads Secrets from the API server: someone
	// else's Secret, which a label-selected cache would not find, is
	// found whole.
	var s corev1.Secret
	if err := mgr.GetClient().Get(ctx, client.ObjectKey{Namespace: ns, Name: "their-secret"}, &s); err != nil {
		t.Fatalf("client Get of a Secret: %v", err)
	}
	if string(s.Data["password"]) != "hunter2" || s.Annotations[kubecache.LastAppliedAnnotation] == "" {
		t.Errorf("client Get of a Secret did not read it from the API server: %+v", s.ObjectMeta)
	}
}

// checkStripped fails unless obj lost its managedFields and last-applied
// annotation and kept its other annotations.
func checkStripped(t *testing.T, what string, obj metav1.Object) {
	t.Helper()
	if len(obj.GetManagedFields()) != 0 {
		t.Errorf("%s cached with managedFields", what)
	}
	if _, ok := obj.GetAnnotations()[kubecache.LastAppliedAnnotation]; ok {
		t.Errorf("%s cached with the last-applied annotation", what)
	}
	if obj.GetAnnotations()["keep"] != "me" {
		t.Errorf("%s cached without its other annotations: %v", what, obj.GetAnnotations())
	}
}
