package provisioner_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/provisioner"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// kube is the real kube-apiserver (with etcd and the CRDs) every test of
// this package shares; each test works in its own namespace with its own
// manager.
var kube *testenv.KubeAPI

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Verbose() {
		log.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr)))
	} else {
		log.SetLogger(zap.New(zap.WriteTo(devNull{})))
	}
	k, err := testenv.StartKubeAPI(context.Background(), testenv.KubeAPIOptions{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-apiserver: %v\n", err)
		os.Exit(1)
	}
	kube = k
	code := m.Run()
	k.Stop()
	os.Exit(code)
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

// harness runs the reconciler in a manager against one namespace.
type harness struct {
	t        *testing.T
	ns       string
	c        client.Client // uncached, for the test's own reads and writes
	recorder *countingRecorder
}

type harnessOptions struct {
	cleanupTimeout time.Duration
}

func newHarness(t *testing.T, opts harnessOptions) *harness {
	t.Helper()
	s := scheme.New()
	c, err := client.New(kube.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	ns := "prov-" + randomHex(4)
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(kube.Config, ctrl.Options{
		Scheme:                 s,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		// Every test runs its own manager with the same controller name.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := &countingRecorder{inner: mgr.GetEventRecorder("coder-k8s")}
	r := &provisioner.Reconciler{
		Client:         mgr.GetClient(),
		APIReader:      mgr.GetAPIReader(),
		Scheme:         mgr.GetScheme(),
		Recorder:       rec,
		CoderTimeout:   5 * time.Second,
		DefaultImage:   provisioner.DefaultImage,
		CleanupTimeout: opts.cleanupTimeout,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return &harness{t: t, ns: ns, c: c, recorder: rec}
}

// createControlPlane creates a CoderControlPlane for the coderd at url and
// sets its status the way the control plane reconciler does once the
// operator's access works: status.url, the operator token Secret and
// OperatorAccessReady=True. It stands in for the control plane reconciler,
// which does not run in these tests.
func (h *harness) createControlPlane(name, url, token string) {
	h.t.Helper()
	ctx := h.t.Context()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name + "-operator-token"},
		Data:       map[string][]byte{"token": []byte(token)},
	}
	if err := h.c.Create(ctx, secret); err != nil {
		h.t.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: url},
	}
	if err := h.c.Create(ctx, ccp); err != nil {
		h.t.Fatal(err)
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
	if err := h.c.Status().Update(ctx, ccp); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) get(name string) *coderv1alpha1.CoderProvisioner {
	h.t.Helper()
	var p coderv1alpha1.CoderProvisioner
	if err := h.c.Get(h.t.Context(), client.ObjectKey{Namespace: h.ns, Name: name}, &p); err != nil {
		h.t.Fatalf("get CoderProvisioner %s: %v", name, err)
	}
	return &p
}

// eventually polls cond until it returns true or timeout passes; then it
// fails the test with cond's last explanation.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %s", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reconciles returns how often the controller has reconciled in this
// process (controller-runtime's controller_runtime_reconcile_total).
func reconciles(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "coderprovisioner" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// apiEvents lists the events.k8s.io Events about the named object.
func (h *harness) apiEvents(name, eventType, reason string) []eventsv1.Event {
	h.t.Helper()
	var list eventsv1.EventList
	if err := h.c.List(h.t.Context(), &list, client.InNamespace(h.ns)); err != nil {
		h.t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Regarding.Kind == "CoderProvisioner" && e.Type == eventType && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// countingRecorder passes events to the manager's recorder and counts
// them: the events API folds repeats into a series only every 30 minutes,
// so counting at the source is what shows an event was emitted once.
type countingRecorder struct {
	inner events.EventRecorder
	mu    sync.Mutex
	seen  []recordedEvent
}

type recordedEvent struct {
	name, eventType, reason, note string
}

func (r *countingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	name := ""
	if o, ok := regarding.(metav1.Object); ok {
		name = o.GetName()
	}
	r.mu.Lock()
	r.seen = append(r.seen, recordedEvent{name, eventtype, reason, fmt.Sprintf(note, args...)})
	r.mu.Unlock()
	r.inner.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func (r *countingRecorder) count(name, eventType, reason string) int {
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

func (r *countingRecorder) warnings(name string) []string {
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

func condition(p *coderv1alpha1.CoderProvisioner, t string) *metav1.Condition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func describeConditions(p *coderv1alpha1.CoderProvisioner) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s/%s(%q)", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
