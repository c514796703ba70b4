package controllertest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/kubecache"
)

// Harness runs one reconciler of a kind that references a control plane
// in a manager of its own, against a namespace of its own.
type Harness struct {
	T  *testing.T
	NS string
	// C is uncached, for the test's own reads and writes.
	C client.Client
	// Recorder counts the events the reconciler records.
	Recorder *Recorder
	// Writes counts the reconciler's writes (the client setup is given).
	Writes *WriteCounter
	// cache reads what the reconciler sees (the manager's cache).
	cache client.Reader
	// kind is the kind under test, as events name it.
	kind string
}

// NewHarness creates a namespace named after nsPrefix and runs a manager
// whose cache sees only it, with the reconciler setup registers; setup is
// given the manager, the client to write with (it counts the writes) and
// the events recorder to use. kind is the kind the
// reconciler reconciles (for Object and APIEvents).
func NewHarness(t *testing.T, kind, nsPrefix string, setup func(ctrl.Manager, client.Client, events.EventRecorder) error) *Harness {
	t.Helper()
	c := Client(t)
	ns := Namespace(t, nsPrefix)
	mgr := NewManager(t, kube.Config, ns)
	rec := &Recorder{inner: mgr.GetEventRecorder("coder-k8s")}
	writes := CountWrites(mgr.GetClient())
	if err := setup(mgr, writes, rec); err != nil {
		t.Fatal(err)
	}
	StartManager(t, mgr)
	return &Harness{T: t, NS: ns, C: c, Recorder: rec, Writes: writes, cache: mgr.GetClient(), kind: kind}
}

// CreateControlPlane creates a CoderControlPlane for the coderd at url and
// sets its status the way the control plane reconciler does once the
// operator's access works: status.url, the operator token Secret and
// OperatorAccessReady=True. It stands in for the control plane reconciler,
// which does not run in these tests.
func (h *Harness) CreateControlPlane(name, url, token string) {
	h.T.Helper()
	ctx := h.T.Context()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: coderapi.TokenSecretName(name)},
		Data:       map[string][]byte{"token": []byte(token)},
	}
	if err := h.C.Create(ctx, secret); err != nil {
		h.T.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.NS, Name: name},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: url},
	}
	if err := h.C.Create(ctx, ccp); err != nil {
		h.T.Fatal(err)
	}
	ccp.Status = coderv1alpha1.CoderControlPlaneStatus{
		ObservedGeneration:     ccp.Generation,
		Phase:                  coderv1alpha1.PhaseReady,
		URL:                    url,
		OperatorUser:           "coder-k8s",
		OperatorTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: secret.Name, Key: "token"},
		Conditions: []metav1.Condition{{
			Type: coderv1alpha1.ConditionOperatorAccessReady, Status: metav1.ConditionTrue,
			Reason: "TokenValid", Message: "the operator's token is valid",
			ObservedGeneration: ccp.Generation, LastTransitionTime: metav1.Now(),
		}},
	}
	if err := h.C.Status().Update(ctx, ccp); err != nil {
		h.T.Fatal(err)
	}
	// A control plane that was ready before the test's objects exist: the
	// reconciler's cache must have the status, not only the create, or its
	// first pass sees operator access not ready yet.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var cached coderv1alpha1.CoderControlPlane
		err := h.cache.Get(ctx, client.ObjectKeyFromObject(ccp), &cached)
		if err == nil && apimeta.IsStatusConditionTrue(cached.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
			return
		}
		if time.Now().After(deadline) {
			h.T.Fatalf("control plane %s/%s: the manager's cache has no ready status after 30s (%v)", h.NS, name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Object reads the named object of the kind under test into obj.
func (h *Harness) Object(name string, obj client.Object) {
	h.T.Helper()
	h.get(h.kind, name, obj)
}

// Secret reads the named Secret.
func (h *Harness) Secret(name string) *corev1.Secret {
	h.T.Helper()
	var s corev1.Secret
	h.get("Secret", name, &s)
	return &s
}

// Deployment reads the named Deployment.
func (h *Harness) Deployment(name string) *appsv1.Deployment {
	h.T.Helper()
	var d appsv1.Deployment
	h.get("Deployment", name, &d)
	return &d
}

// Service reads the named Service.
func (h *Harness) Service(name string) *corev1.Service {
	h.T.Helper()
	var s corev1.Service
	h.get("Service", name, &s)
	return &s
}

func (h *Harness) get(kind, name string, obj client.Object) {
	h.T.Helper()
	if err := h.C.Get(h.T.Context(), client.ObjectKey{Namespace: h.NS, Name: name}, obj); err != nil {
		h.T.Fatalf("get %s %s: %v", kind, name, err)
	}
}

// APIEvents lists the events.k8s.io Events about the named object of the
// kind under test with that type and reason.
func (h *Harness) APIEvents(name, eventType, reason string) []eventsv1.Event {
	h.T.Helper()
	var list eventsv1.EventList
	if err := h.C.List(h.T.Context(), &list, client.InNamespace(h.NS)); err != nil {
		h.T.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == h.kind && e.Type == eventType && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// Recorder passes events to the manager's recorder and counts them: the
// events API folds repeats into a series only every 30 minutes, so
// counting at the source is what shows an event was emitted once.
type Recorder struct {
	inner events.EventRecorder
	mu    sync.Mutex
	seen  []recordedEvent
}

type recordedEvent struct {
	name, eventType, reason, note string
}

// Eventf implements events.EventRecorder.
func (r *Recorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	name := ""
	if o, ok := regarding.(metav1.Object); ok {
		name = o.GetName()
	}
	r.mu.Lock()
	r.seen = append(r.seen, recordedEvent{name, eventtype, reason, fmt.Sprintf(note, args...)})
	r.mu.Unlock()
	r.inner.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// Count returns how many events about the named object had that type and
// reason.
func (r *Recorder) Count(name, eventType, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.seen {
		if e.name == name && e.eventType == eventType && e.reason == reason {
			n++
		}
	}
	return n
}

// Warnings returns the Warning events about the named object as
// "reason: note".
func (r *Recorder) Warnings(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.seen {
		if e.name == name && e.eventType == corev1.EventTypeWarning {
			out = append(out, e.reason+": "+e.note)
		}
	}
	return out
}

// CheckCached fails the test unless every object carries the labels the
// manager's cache selects (package kubecache): children it misses would
// be written but never watched.
func CheckCached(t *testing.T, objs ...client.Object) {
	t.Helper()
	sel := kubecache.Selector()
	for _, o := range objs {
		if !sel.Matches(labels.Set(o.GetLabels())) {
			t.Errorf("%T %s is not selected by the manager's cache (%s): labels %v", o, o.GetName(), sel, o.GetLabels())
		}
	}
}
