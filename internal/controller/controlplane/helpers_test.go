package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The tests share one real kube-apiserver and etcd; each test works in
// namespaces of its own and runs its own manager whose cache sees only
// those namespaces.
func TestMain(m *testing.M) {
	controllertest.Main(m, controllertest.MainOptions{AlwaysLog: true})
}

// fakeAccess stands in for the operator access manager in tests where no
// coderd can exist: deployed control planes, whose in-cluster URL nothing
// outside a cluster can reach.
type fakeAccess struct {
	mu        sync.Mutex
	result    operatoraccess.Result
	err       error
	revokeErr error
	urls      []string
	dials     []string
	revokes   int
}

func (f *fakeAccess) ReconcileAt(_ context.Context, _ *coderv1alpha1.CoderControlPlane, ep operatoraccess.Endpoint) (operatoraccess.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.urls = append(f.urls, ep.URL)
	f.dials = append(f.dials, ep.Dial)
	res := f.result
	// A working access manager knows the first user exists.
	res.FirstUser = res.FirstUser || (res.Ready && ep.Dial != "")
	return res, f.err
}

func (f *fakeAccess) Revoke(context.Context, *coderv1alpha1.CoderControlPlane, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revokes++
	return f.revokeErr
}

func (f *fakeAccess) set(res operatoraccess.Result, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.result, f.err = res, err
}

func (f *fakeAccess) calls() (urls []string, revokes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.urls), f.revokes
}

// readyAccess is what a working access manager reports.
func readyAccess() operatoraccess.Result {
	return operatoraccess.Result{
		Ready:          true,
		Reason:         coderv1alpha1.ReasonTokenValid,
		Message:        "the operator's token is valid",
		TokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "coder-operator-token", Key: "token"},
		User:           "coder-k8s",
		CoderVersion:   "v2.30.0",
		RequeueAfter:   time.Hour,
	}
}

// harness is a running manager with the reconciler under test.
type harness struct {
	r      *Reconciler
	writes *controllertest.WriteCounter
	access *fakeAccess
	c      client.Client // direct client for the test's own reads and writes
}

// startManager runs a manager whose cache sees namespaces, with the
// reconciler set up as the composition root would, except for access
// (fakeAccess unless given) and the tweaks.
func startManager(t *testing.T, namespaces []string, access AccessManager, tweak func(*Reconciler)) *harness {
	t.Helper()
	return startManagerAs(t, controllertest.Kube().Config, namespaces, access, tweak)
}

// startManagerAs is startManager with the manager authenticating with cfg.
func startManagerAs(t *testing.T, cfg *rest.Config, namespaces []string, access AccessManager, tweak func(*Reconciler)) *harness {
	t.Helper()
	mgr := controllertest.NewManager(t, cfg, namespaces...)
	h := &harness{c: controllertest.Client(t), writes: controllertest.CountWrites(mgr.GetClient())}
	if access == nil {
		h.access = &fakeAccess{result: readyAccess()}
		access = h.access
	}
	h.r = &Reconciler{Client: h.writes, Access: access, GatewayAPIRecheckPeriod: time.Second}
	if tweak != nil {
		tweak(h.r)
	}
	if err := h.r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setup: %v", err)
	}
	controllertest.StartManager(t, mgr)
	syncCtx, syncCancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("cache did not sync")
	}
	return h
}

// eventually retries check until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = check(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// newControlPlane returns a control plane as a user would write it.
func newControlPlane(ns, name string) *coderv1alpha1.CoderControlPlane {
	return &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
	}
}

func create(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func getCCP(t *testing.T, c client.Client, ns, name string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	var ccp coderv1alpha1.CoderControlPlane
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &ccp); err != nil {
		t.Fatalf("get control plane: %v", err)
	}
	return &ccp
}

// deleteCCP deletes the control plane and waits up to timeout until it is
// gone (its finalizer done).
func deleteCCP(t *testing.T, c client.Client, ns, name string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	if err := c.Delete(ctx, &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, timeout, "control plane deleted", func() error {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &coderv1alpha1.CoderControlPlane{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}

// updateCCP applies change to the latest version of the control plane.
func updateCCP(t *testing.T, c client.Client, ns, name string, change func(*coderv1alpha1.CoderControlPlane)) {
	t.Helper()
	eventually(t, 10*time.Second, "update control plane", func() error {
		ccp := getCCP(t, c, ns, name)
		change(ccp)
		return c.Update(context.Background(), ccp)
	})
}

// waitCondition waits until the control plane's condition has status and
// reason (any reason when empty) for its current generation.
func waitCondition(t *testing.T, c client.Client, ns, name, typ string, status metav1.ConditionStatus, reason string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	return waitConditionFor(t, 30*time.Second, c, ns, name, typ, status, reason)
}

// waitConditionFor is waitCondition waiting up to timeout.
func waitConditionFor(t *testing.T, timeout time.Duration, c client.Client, ns, name, typ string, status metav1.ConditionStatus, reason string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	var ccp *coderv1alpha1.CoderControlPlane
	eventually(t, timeout, fmt.Sprintf("condition %s=%s (%s)", typ, status, reason), func() error {
		ccp = getCCP(t, c, ns, name)
		cond := apimeta.FindStatusCondition(ccp.Status.Conditions, typ)
		switch {
		case cond == nil:
			return fmt.Errorf("no condition %s in %+v", typ, ccp.Status.Conditions)
		case cond.Status != status || (reason != "" && cond.Reason != reason):
			return fmt.Errorf("condition %s is %s/%s: %s", typ, cond.Status, cond.Reason, cond.Message)
		case cond.ObservedGeneration != ccp.Generation || ccp.Status.ObservedGeneration != ccp.Generation:
			return fmt.Errorf("status describes generation %d (condition %d), object is at %d", ccp.Status.ObservedGeneration, cond.ObservedGeneration, ccp.Generation)
		}
		return nil
	})
	return ccp
}

// waitEvent waits for an event about the control plane with the given
// type and reason, as `kubectl events` would show it.
func waitEvent(t *testing.T, ns, name, eventType, reason string) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	eventually(t, 30*time.Second, fmt.Sprintf("%s event %s", eventType, reason), func() error {
		list, err := controllertest.Kube().Clientset.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind != "CoderControlPlane" || e.Regarding.Name != name {
				continue
			}
			if e.Type == eventType && e.Reason == reason {
				found = e
				return nil
			}
			seen = append(seen, e.Type+"/"+e.Reason)
		}
		return fmt.Errorf("events seen: %s", strings.Join(seen, ", "))
	})
	return found
}

// countEvents counts events about the control plane with a reason.
func countEvents(t *testing.T, ns, name, reason string) int {
	t.Helper()
	list, err := controllertest.Kube().Clientset.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			n++
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}

func findEnv(env []corev1.EnvVar, name string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// tlsSecret is a kubernetes.io/tls Secret with a real certificate for
// host, signed by a fresh CA whose certificate is under ca.crt.
func tlsSecret(t *testing.T, ns, name, host string) *corev1.Secret {
	t.Helper()
	ca, err := testenv.NewCA(name + "-ca")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.ServingCert([]string{host}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": kp.CertPEM, "tls.key": kp.KeyPEM, "ca.crt": ca.CertPEM},
	}
}
