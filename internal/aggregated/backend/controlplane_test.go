package backend

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// controlPlane is what createControlPlane sets up; the options make it
// ineligible in the ways the operator's status can.
type controlPlane struct {
	name, token string
	// notReady writes OperatorAccessReady=False.
	notReady bool
	// disabled sets spec.operatorAccess.disabled (with a stale ready
	// status, as right after the user disables access).
	disabled bool
	// noSecret references a token Secret that does not exist.
	noSecret bool
	// unlabeled writes the token Secret without the operator's labels.
	unlabeled bool
	// unowned writes the token Secret, labeled, without the control
	// plane as its controller: someone else's Secret.
	unowned bool
	// finalizer keeps the object around once deleted.
	finalizer bool
	// issuedFor is the coderd URL the token Secret says its token was
	// issued for (coderapi.AnnotationCoderURL); empty: the test coderd's.
	issuedFor string
	// firstUser says the operator created coderd's first user (its
	// status names the first user's Secret).
	firstUser bool
}

// createControlPlane stands in for the control plane reconciler (which
// does not run here): a CoderControlPlane adopting the test coderd, its
// operator token Secret as operatoraccess writes it, and the status the
// reconciler writes once operator access works.
func createControlPlane(t *testing.T, c client.Client, ns string, cp controlPlane) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := t.Context()
	if cp.token == "" {
		cp.token = coderd.SessionToken
	}
	secretName := coderapi.TokenSecretName(cp.name)
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cp.name},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coderd.URL.String()},
	}
	ccp.Spec.OperatorAccess.Disabled = cp.disabled
	if cp.finalizer {
		ccp.Finalizers = []string{"test.coder.com/hold"}
	}
	if err := c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	if !cp.noSecret {
		issuedFor := cp.issuedFor
		if issuedFor == "" {
			issuedFor = coderd.URL.String()
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName, Annotations: map[string]string{coderapi.AnnotationCoderURL: issuedFor}},
			Data:       map[string][]byte{coderapi.TokenKey: []byte(cp.token)},
		}
		if !cp.unlabeled {
			secret.Labels = coderapi.OperatorSecretLabels(cp.name)
		}
		if !cp.unowned {
			if err := controllerutil.SetControllerReference(ccp, secret, c.Scheme()); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	status := metav1.ConditionTrue
	if cp.notReady {
		status = metav1.ConditionFalse
	}
	var admin *corev1.LocalObjectReference
	if cp.firstUser {
		admin = &corev1.LocalObjectReference{Name: cp.name + "-admin"}
	}
	ccp.Status = coderv1alpha1.CoderControlPlaneStatus{
		ObservedGeneration:        ccp.Generation,
		Phase:                     coderv1alpha1.PhaseReady,
		URL:                       coderd.URL.String(),
		OperatorUser:              "coder-k8s",
		OperatorTokenSecretRef:    &coderv1alpha1.SecretKeyReference{Name: secretName, Key: coderapi.TokenKey},
		AdminCredentialsSecretRef: admin,
		Conditions: []metav1.Condition{{
			Type: coderv1alpha1.ConditionOperatorAccessReady, Status: status,
			Reason: "Test", Message: "set by the test",
			ObservedGeneration: ccp.Generation, LastTransitionTime: metav1.Now(),
		}},
	}
	if err := c.Status().Update(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	if cp.finalizer {
		t.Cleanup(func() {
			var cur coderv1alpha1.CoderControlPlane
			if err := c.Get(t.Context(), client.ObjectKeyFromObject(ccp), &cur); err == nil {
				cur.Finalizers = nil
				_ = c.Update(t.Context(), &cur)
			}
		})
	}
	return ccp
}

// startProvider runs a manager whose cache sees namespaces, with a
// ControlPlaneProvider, and waits until the provider is ready.
func startProvider(t *testing.T, namespaces ...string) *ControlPlaneProvider {
	t.Helper()
	mgr := controllertest.NewManager(t, kube.Config, namespaces...)
	p, err := NewControlPlaneProvider(mgr, 10*time.Second, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ready(); err == nil {
		t.Errorf("Ready before the manager started = nil, want an error")
	}
	controllertest.StartManager(t, mgr)
	eventually(t, "provider ready", func() (bool, string) {
		if err := p.Ready(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return p
}

func keys(bs []Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Key()
	}
	return out
}

// waitBackends waits until Backends(ns) returns exactly want (keys, in
// order) and returns them.
func waitBackends(t *testing.T, p Provider, ns string, want ...string) []Backend {
	t.Helper()
	var got []Backend
	eventually(t, fmt.Sprintf("Backends(%q) = %v", ns, want), func() (bool, string) {
		var err error
		got, err = p.Backends(t.Context(), ns)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(keys(got), want), fmt.Sprintf("got %v", keys(got))
	})
	return got
}

// checkWorks calls the real coderd with the backend's client.
func checkWorks(t *testing.T, b Backend) {
	t.Helper()
	if b.URL.String() != coderd.URL.String() {
		t.Errorf("%s: URL = %s, want %s", b.Key(), b.URL, coderd.URL)
	}
	me, err := b.Client.User(t.Context(), codersdk.Me)
	if err != nil {
		t.Fatalf("%s: coderd refused the backend's client: %v", b.Key(), err)
	}
	if me.Username != coderd.Username {
		t.Errorf("%s: acting as %q, want %q", b.Key(), me.Username, coderd.Username)
	}
}

func TestControlPlaneBackends(t *testing.T) {
	c := kubeClient(t)
	ctx := t.Context()
	nsA, nsB := namespace(t, "backends-a"), namespace(t, "backends-b")

	// Created out of order, to see them sorted.
	createControlPlane(t, c, nsA, controlPlane{name: "beta"})
	createControlPlane(t, c, nsA, controlPlane{name: "alpha"})
	createControlPlane(t, c, nsB, controlPlane{name: "gamma", firstUser: true})
	// Not served.
	createControlPlane(t, c, nsA, controlPlane{name: "not-ready", notReady: true})
	createControlPlane(t, c, nsA, controlPlane{name: "disabled", disabled: true})
	createControlPlane(t, c, nsA, controlPlane{name: "no-secret", noSecret: true})
	createControlPlane(t, c, nsA, controlPlane{name: "unlabeled", unlabeled: true})
	createControlPlane(t, c, nsA, controlPlane{name: "unowned", unowned: true})
	// A token issued by another coderd is not sent to status.url.
	createControlPlane(t, c, nsA, controlPlane{name: "issued-elsewhere", issuedFor: "https://other-coderd.example.com"})
	deleting := createControlPlane(t, c, nsA, controlPlane{name: "deleting", finalizer: true})
	if err := c.Delete(ctx, deleting); err != nil {
		t.Fatal(err)
	}

	p := startProvider(t, nsA, nsB)

	got := waitBackends(t, p, nsA, nsA+"/alpha", nsA+"/beta")
	for _, b := range got {
		if b.Namespace != nsA {
			t.Errorf("%s: namespace %q", b.Key(), b.Namespace)
		}
		checkWorks(t, b)
	}
	if got[0].Client == got[1].Client {
		t.Errorf("two control planes share one client")
	}
	waitBackends(t, p, nsB, nsB+"/gamma")
	all := waitBackends(t, p, "", nsA+"/alpha", nsA+"/beta", nsB+"/gamma")
	checkWorks(t, all[2])
	// The operator's own user is never a caller's; nor is the first user
	// of a coderd the operator set up.
	for _, b := range all {
		want := []string{"coder-k8s"}
		if b.ControlPlane == "gamma" {
			want = []string{"coder-k8s", "admin"}
		}
		if !slices.Equal(b.ReservedUsers, want) {
			t.Errorf("%s: reserved users %q, want %q", b.Key(), b.ReservedUsers, want)
		}
	}

	if bs, err := p.Backends(ctx, "no-such-namespace"); err != nil || len(bs) != 0 {
		t.Errorf("Backends(no-such-namespace) = %v, %v; want none", keys(bs), err)
	}

	// A control plane whose access goes away stops being served.
	var alpha coderv1alpha1.CoderControlPlane
	if err := c.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "alpha"}, &alpha); err != nil {
		t.Fatal(err)
	}
	alpha.Status.Conditions[0].Status = metav1.ConditionFalse
	alpha.Status.Conditions[0].Reason = "TokenRevoked"
	if err := c.Status().Update(ctx, &alpha); err != nil {
		t.Fatal(err)
	}
	waitBackends(t, p, nsA, nsA+"/beta")
	p.mu.Lock()
	_, kept := p.clients[client.ObjectKey{Namespace: nsA, Name: "alpha"}]
	p.mu.Unlock()
	if kept {
		t.Errorf("the client of a control plane no longer served is kept")
	}
}

func TestControlPlaneClientReuse(t *testing.T) {
	c := kubeClient(t)
	ctx := t.Context()
	ns := namespace(t, "backends-reuse")
	ccp := createControlPlane(t, c, ns, controlPlane{name: "coder"})
	p := startProvider(t, ns)

	first := waitBackends(t, p, ns, ns+"/coder")[0]
	checkWorks(t, first)
	for range 3 {
		again, err := p.Backends(ctx, ns)
		if err != nil || len(again) != 1 {
			t.Fatalf("Backends = %v, %v", keys(again), err)
		}
		if again[0].Client != first.Client {
			t.Fatalf("the client was rebuilt though nothing changed")
		}
	}

	// A status change that keeps the URL and the Secret keeps the client.
	if err := c.Get(ctx, client.ObjectKeyFromObject(ccp), ccp); err != nil {
		t.Fatal(err)
	}
	ccp.Status.CoderVersion = "v2.30.0"
	if err := c.Status().Update(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status change seen", func() (bool, string) {
		var cached coderv1alpha1.CoderControlPlane
		if err := p.shared.Get(ctx, client.ObjectKeyFromObject(ccp), &cached); err != nil {
			return false, err.Error()
		}
		return cached.Status.CoderVersion == "v2.30.0", "cache has version " + cached.Status.CoderVersion
	})
	if bs, err := p.Backends(ctx, ns); err != nil || len(bs) != 1 || bs[0].Client != first.Client {
		t.Fatalf("after a status change: Backends = %v, %v; want the same client", keys(bs), err)
	}

	// A rotated token (a new token in the Secret) gets a new client.
	key, err := coderd.Client.CreateToken(ctx, codersdk.Me, codersdk.CreateTokenRequest{TokenName: "backend-" + controllertest.RandomHex(3)})
	if err != nil {
		t.Fatal(err)
	}
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "coder-operator-token"}, &secret); err != nil {
		t.Fatal(err)
	}
	secret.Data["token"] = []byte(key.Key)
	if err := c.Update(ctx, &secret); err != nil {
		t.Fatal(err)
	}
	var rotated Backend
	eventually(t, "client with the rotated token", func() (bool, string) {
		bs, err := p.Backends(ctx, ns)
		if err != nil || len(bs) != 1 {
			return false, fmt.Sprintf("Backends = %v, %v", keys(bs), err)
		}
		rotated = bs[0]
		return rotated.Client.SessionToken() == key.Key, "still the old token"
	})
	if rotated.Client == first.Client {
		t.Errorf("the client was changed in place rather than replaced")
	}
	checkWorks(t, rotated)
	if first.Client.SessionToken() != coderd.SessionToken {
		t.Errorf("the old client's token changed under in-flight requests")
	}
	if bs, err := p.Backends(ctx, ns); err != nil || len(bs) != 1 || bs[0].Client != rotated.Client {
		t.Errorf("Backends = %v, %v; want the new client reused", keys(bs), err)
	}
}

func TestTerminatingNamespaceHasNoBackends(t *testing.T) {
	c := kubeClient(t)
	ns, other := namespace(t, "backends-term"), namespace(t, "backends-live")
	createControlPlane(t, c, ns, controlPlane{name: "coder"})
	createControlPlane(t, c, other, controlPlane{name: "coder"})
	p := startProvider(t, ns, other)
	waitBackends(t, p, ns, ns+"/coder")

	deleteNamespace(t, c, ns)
	waitBackends(t, p, ns)
	// The control plane object is still there, with ready access: only
	// the namespace's state keeps it out.
	var ccp coderv1alpha1.CoderControlPlane
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "coder"}, &ccp); err != nil {
		t.Fatalf("control plane in the terminating namespace: %v", err)
	}
	waitBackends(t, p, "", other+"/coder")
}

func TestSecretCacheHoldsOnlyOperatorSecrets(t *testing.T) {
	c := kubeClient(t)
	ctx := t.Context()
	ns := namespace(t, "backends-secrets")
	createControlPlane(t, c, ns, controlPlane{name: "coder"})
	others := []*corev1.Secret{
		// A user's Secret.
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "user-secret"}, StringData: map[string]string{"password": "hunter2"}},
		// Another tool's managed Secret.
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "helm-like", Labels: map[string]string{coderv1alpha1.LabelManagedBy: "Helm"}},
			StringData: map[string]string{"x": "y"}},
		// The first user's credentials, which carry the operator's labels.
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coder-admin", Labels: coderapi.OperatorSecretLabels("coder")},
			StringData: map[string]string{"email": "admin@example.com", "password": "hunter2"}},
	}
	for _, s := range others {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	p := startProvider(t, ns)
	waitBackends(t, p, ns, ns+"/coder")

	var cached corev1.SecretList
	eventually(t, "operator Secrets cached", func() (bool, string) {
		if err := p.secrets.List(ctx, &cached, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(cached.Items) == 2, fmt.Sprintf("%d Secrets cached", len(cached.Items))
	})
	var names []string
	for _, s := range cached.Items {
		names = append(names, s.Name)
		if len(s.ManagedFields) > 0 {
			t.Errorf("Secret %s is cached with managedFields", s.Name)
		}
		switch s.Name {
		case "coder-operator-token":
			if string(s.Data["token"]) != coderd.SessionToken {
				t.Errorf("token Secret cached without its token")
			}
		case "coder-admin":
			if len(s.Data) != 0 {
				t.Errorf("the admin credentials are cached: keys %v", keysOf(s.Data))
			}
		}
	}
	slices.Sort(names)
	if want := []string{"coder-admin", "coder-operator-token"}; !slices.Equal(names, want) {
		t.Errorf("cached Secrets = %v, want %v", names, want)
	}
	err := p.secrets.Get(ctx, client.ObjectKey{Namespace: ns, Name: "user-secret"}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Get(user-secret) from the provider's cache = %v, want NotFound", err)
	}
	// Nothing but Secrets goes through this cache.
	err = p.secrets.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))
	if err == nil || !strings.Contains(err.Error(), "ConfigMap") {
		t.Errorf("listing ConfigMaps through the Secret cache = %v, want an error", err)
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestSecretCacheDropsOthersSecrets: Secrets anyone may create with the
// operator's labels, with large payloads, are cut down to their identity
// in the token Secret cache (no labels, annotations or data), also one
// shaped like a token Secret (name, labels, a controller owner reference
// to a CoderControlPlane) whose token is longer than any Coder API key.
// The heap of this process does not grow by their size.
func TestSecretCacheDropsOthersSecrets(t *testing.T) {
	c := kubeClient(t)
	ctx := t.Context()
	ns := namespace(t, "backends-hostile")
	createControlPlane(t, c, ns, controlPlane{name: "coder"})

	const count, size = 16, 900 << 10
	payload := make([]byte, size)
	_, _ = rand.Read(payload)
	hostile := func(i int) *corev1.Secret {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("hostile-%d", i), Labels: coderapi.OperatorSecretLabels("coder"),
				Annotations: map[string]string{"note": strings.Repeat("x", 1024)}},
			Data: map[string][]byte{"blob": payload},
		}
		switch i {
		case 0:
			// Named like a token Secret, owned by nobody.
			s.Name, s.Labels = coderapi.TokenSecretName("impostor"), coderapi.OperatorSecretLabels("impostor")
			s.Data = map[string][]byte{coderapi.TokenKey: payload}
		case 1:
			// Shaped like a token Secret in every way, with an owner
			// reference to a control plane that does not exist.
			s.Name, s.Labels = coderapi.TokenSecretName("ghost"), coderapi.OperatorSecretLabels("ghost")
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: coderv1alpha1.GroupVersion.String(), Kind: "CoderControlPlane",
				Name: "ghost", UID: "0b5e7c3e-0000-4000-8000-000000000000", Controller: ptr.To(true)}}
			s.Data = map[string][]byte{coderapi.TokenKey: payload[:size/2], "blob": payload[size/2:]}
		}
		return s
	}
	// Half exist when the cache lists, half arrive by watch.
	for i := range count / 2 {
		if err := c.Create(ctx, hostile(i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	p := startProvider(t, ns)
	for i := count / 2; i < count; i++ {
		if err := c.Create(ctx, hostile(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitBackends(t, p, ns, ns+"/coder")
	var cached corev1.SecretList
	eventually(t, "every labeled Secret seen", func() (bool, string) {
		if err := p.secrets.List(ctx, &cached, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(cached.Items) == count+1, fmt.Sprintf("%d Secrets cached, want %d", len(cached.Items), count+1)
	})
	for _, s := range cached.Items {
		if s.Name == coderapi.TokenSecretName("coder") {
			if string(s.Data[coderapi.TokenKey]) != coderd.SessionToken || len(s.Data) != 1 || len(s.OwnerReferences) != 1 ||
				len(s.Annotations) != 1 || s.Annotations[coderapi.AnnotationCoderURL] != coderd.URL.String() {
				t.Errorf("token Secret cached as data keys %v, owners %v, annotations %v; want the token, its owner and the URL it was issued for", keysOf(s.Data), s.OwnerReferences, s.Annotations)
			}
			continue
		}
		if len(s.Data) != 0 || len(s.Labels) != 0 || len(s.Annotations) != 0 || len(s.OwnerReferences) != 0 || s.UID == "" || s.ResourceVersion == "" {
			t.Errorf("Secret %s cached with data keys %v, labels %v, annotations %d, owners %v, uid %q, resourceVersion %q; want its identity only",
				s.Name, keysOf(s.Data), s.Labels, len(s.Annotations), s.OwnerReferences, s.UID, s.ResourceVersion)
		}
	}

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %.1f MiB while %d Secrets of %d KiB each were listed and watched", float64(grew)/(1<<20), count, size>>10)
	if held := int64(count) * size; grew > held/4 {
		t.Errorf("heap grew by %.1f MiB with %.1f MiB of other people's Secrets in the cluster: their data is held", float64(grew)/(1<<20), float64(held)/(1<<20))
	}
	runtime.KeepAlive(p)
}
