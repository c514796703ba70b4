package admission

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestPolicyPluginsFollowWhatTheClusterServes: against a real
// kube-apiserver 1.36, both policy plugins run; against one that does not
// serve mutatingadmissionpolicies (as before 1.36), MutatingAdmissionPolicy
// is off, so it never waits for an informer that cannot sync.
func TestPolicyPluginsFollowWhatTheClusterServes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args map[string]string
		off  []string
	}{
		{"every policy API served", nil, nil},
		// kube-apiserver's own plugin needs the API it reads.
		{"no mutatingadmissionpolicies", map[string]string{
			"runtime-config":            "admissionregistration.k8s.io/v1/mutatingadmissionpolicies=false",
			"disable-admission-plugins": "ServiceAccount,MutatingAdmissionPolicy",
		}, []string{"MutatingAdmissionPolicy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{Args: tc.args})
			cs, err := kubernetes.NewForConfig(k.Config)
			if err != nil {
				t.Fatal(err)
			}
			off, err := unservedPolicyPlugins(t.Context(), cs.Discovery())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(off, tc.off) {
				t.Errorf("plugins off: %v, want %v", off, tc.off)
			}
			// The shared cache's options name the mutating policies' kinds
			// whether or not the cluster serves them: that must not stop
			// the cache serving the kinds admission reads.
			co := kubecache.Options()
			co.Scheme = scheme.New()
			c, err := cache.New(k.Config, co)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			go func() { _ = c.Start(ctx) }()
			if _, err := c.GetInformer(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{}); err != nil {
				t.Errorf("the shared cache's ValidatingAdmissionPolicy informer: %v", err)
			}
		})
	}
}

// TestPluginsReadTheSharedCache: the informers the plugins get are the
// controller-runtime cache's own (one list and watch per kind per process),
// except the mutating policies' (their own informer), and the factory
// reports all of them synced once started.
func TestPluginsReadTheSharedCache(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	co := kubecache.Options()
	co.Scheme = scheme.New()
	c, err := cache.New(k.Config, co)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	f := newSharedCache(ctx, cs, c, testr.New(t))
	namespaces := f.Core().V1().Namespaces().Informer()
	policies := f.Admissionregistration().V1().ValidatingAdmissionPolicies().Informer()
	// Not in the cache (it may be unserved): the factory's own informer.
	_ = f.Admissionregistration().V1().MutatingAdmissionPolicies().Informer()
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	f.Start(ctx.Done())

	for _, tc := range []struct {
		obj client.Object
		got toolscache.SharedIndexInformer
	}{
		{&corev1.Namespace{}, namespaces},
		{&admissionregistrationv1.ValidatingAdmissionPolicy{}, policies},
	} {
		want, err := c.GetInformer(ctx, tc.obj)
		if err != nil {
			t.Fatal(err)
		}
		if want.(toolscache.SharedIndexInformer) != tc.got {
			t.Errorf("%T: the plugins' informer is not the cache's", tc.obj)
		}
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		synced := f.WaitForCacheSync(ctx.Done())
		for _, typ := range []reflect.Type{reflect.TypeOf(&corev1.Namespace{}), reflect.TypeOf(&admissionregistrationv1.ValidatingAdmissionPolicy{}),
			reflect.TypeOf(&admissionregistrationv1.MutatingAdmissionPolicy{})} {
			if !synced[typ] {
				return fmt.Errorf("%s not synced", typ)
			}
		}
		return nil
	})
	// The namespace lister sees the cluster's namespaces.
	if _, err := f.Core().V1().Namespaces().Lister().Get("kube-system"); err != nil {
		t.Errorf("namespace lister: %v", err)
	}
}
