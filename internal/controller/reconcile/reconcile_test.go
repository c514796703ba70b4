package reconcile_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

func newKit(t *testing.T, patch bool, objs ...client.Object) (reconcile.Kit, *events.FakeRecorder) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := coderv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(objs...).Build()
	rec := events.NewFakeRecorder(10)
	return reconcile.Kit{Client: c, Recorder: rec, PatchStatus: patch}, rec
}

func drain(rec *events.FakeRecorder) []string {
	var got []string
	for {
		select {
		case e := <-rec.Events:
			got = append(got, e)
		default:
			return got
		}
	}
}

func provisioner() *coderv1alpha1.CoderProvisioner {
	return &coderv1alpha1.CoderProvisioner{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 3}}
}

func TestSetConditionReportsTransitions(t *testing.T) {
	obj := provisioner()
	if !reconcile.SetCondition(obj, "Available", metav1.ConditionFalse, "NotYet", strings.Repeat("x", 2000)) {
		t.Error("first set: changed = false")
	}
	c := obj.Status.Conditions[0]
	if c.ObservedGeneration != 3 || len(c.Message) != reconcile.MaxMessage {
		t.Errorf("condition = generation %d, message of %d bytes; want 3, %d", c.ObservedGeneration, len(c.Message), reconcile.MaxMessage)
	}
	if reconcile.SetCondition(obj, "Available", metav1.ConditionFalse, "NotYet", "another message") {
		t.Error("same status and reason: changed = true")
	}
	if !reconcile.SetCondition(obj, "Available", metav1.ConditionFalse, "Other", "") {
		t.Error("new reason: changed = false")
	}
}

func TestFinishWritesThenAnnounces(t *testing.T) {
	for _, patch := range []bool{false, true} {
		obj := provisioner()
		kit, rec := newKit(t, patch, obj)
		ctx := context.Background()
		var live coderv1alpha1.CoderProvisioner
		if err := kit.Client.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p"}, &live); err != nil {
			t.Fatal(err)
		}

		st := reconcile.Begin(&live, &live.Status)
		st.SetCondition("Available", metav1.ConditionTrue, "Ready", "up", "Normal")
		st.SetCondition("Available", metav1.ConditionTrue, "Ready", "still up", "Normal")
		live.SetPhase(coderv1alpha1.PhaseReady)
		res, err := kit.Finish(ctx, st, ctrl.Result{RequeueAfter: time.Minute}, nil)
		if err != nil || res.RequeueAfter != time.Minute {
			t.Fatalf("patch=%v: Finish = %v, %v", patch, res, err)
		}
		if got := drain(rec); len(got) != 1 || got[0] != "Normal Ready up" {
			t.Errorf("patch=%v: events = %q, want one for the transition", patch, got)
		}
		var stored coderv1alpha1.CoderProvisioner
		if err := kit.Client.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "p"}, &stored); err != nil {
			t.Fatal(err)
		}
		if stored.Status.Phase != coderv1alpha1.PhaseReady || stored.Status.ObservedGeneration != stored.Generation || len(stored.Status.Conditions) != 1 {
			t.Errorf("patch=%v: stored status = %+v", patch, stored.Status)
		}

		// A pass from a copy the store has moved past writes nothing and
		// announces nothing; it runs again soon.
		stale := stored.DeepCopy()
		stored.Status.Phase = coderv1alpha1.PhaseDegraded
		if err := kit.Client.Status().Update(ctx, &stored); err != nil {
			t.Fatal(err)
		}
		st = reconcile.Begin(stale, &stale.Status)
		st.SetCondition("Available", metav1.ConditionFalse, "Down", "down", "Warning")
		res, err = kit.Finish(ctx, st, ctrl.Result{}, errors.New("pass failed"))
		if err != nil || res.RequeueAfter != time.Second {
			t.Errorf("patch=%v: stale Finish = %v, %v; want a requeue after 1s", patch, res, err)
		}
		if got := drain(rec); len(got) != 0 {
			t.Errorf("patch=%v: stale pass announced %q", patch, got)
		}
	}
}

func deleting(grace time.Duration) *coderv1alpha1.CoderProvisioner {
	obj := provisioner()
	obj.Finalizers = []string{"coder.com/test"}
	obj.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-grace)}
	return obj
}

func TestCleanIsBounded(t *testing.T) {
	failing := func(context.Context) (string, error) { return "", errors.New("coderd is away") }
	cleanup := reconcile.Cleanup{
		Name: "test", Grace: time.Minute, Action: "Clean", Try: failing,
		DoneReason: "Cleaned", RetryReason: "CleanFailed", GaveUpReason: "CleanAbandoned",
		Retrying: func(err error, _ time.Time) string { return "retrying: " + err.Error() },
		GaveUp:   func(err error) string { return "by hand: " + err.Error() },
	}
	ctx := context.Background()

	kit, rec := newKit(t, false)
	if release, retry := kit.Clean(ctx, deleting(0), cleanup); release || retry <= 0 {
		t.Errorf("within the grace period: release %v, retry %s; want a retry", release, retry)
	}
	if got := drain(rec); len(got) != 1 || got[0] != "Warning CleanFailed retrying: coderd is away" {
		t.Errorf("events = %q", got)
	}

	if release, _ := kit.Clean(ctx, deleting(2*time.Minute), cleanup); !release {
		t.Error("after the grace period: release = false")
	}
	if got := drain(rec); len(got) != 1 || got[0] != "Warning CleanAbandoned by hand: coderd is away" {
		t.Errorf("events = %q", got)
	}

	abandon := cleanup
	abandon.Try = func(context.Context) (string, error) { return "", reconcile.Abandon(errors.New("gone")) }
	if release, _ := kit.Clean(ctx, deleting(0), abandon); !release {
		t.Error("abandoned: release = false")
	}
	if got := drain(rec); len(got) != 1 || got[0] != "Warning CleanAbandoned by hand: gone" {
		t.Errorf("events = %q", got)
	}

	obj := deleting(0)
	kit, rec = newKit(t, false, obj)
	done := cleanup
	done.Try = func(context.Context) (string, error) { return "cleaned it", nil }
	if _, err := kit.Finalize(ctx, obj, "coder.com/test", done); err != nil {
		t.Fatal(err)
	}
	if len(obj.Finalizers) != 0 {
		t.Errorf("finalizers = %v, want none", obj.Finalizers)
	}
	if got := drain(rec); len(got) != 1 || got[0] != "Normal Cleaned cleaned it" {
		t.Errorf("events = %q", got)
	}
}
