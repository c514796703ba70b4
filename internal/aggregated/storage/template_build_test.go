package storage

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

func TestBuildCondition(t *testing.T) {
	started := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	done := time.Date(2026, 1, 2, 3, 6, 0, 0, time.UTC)
	active := uuid.MustParse("11111111-1111-1111-1111-111111111111")
	building := uuid.MustParse("22222222-2222-2222-2222-222222222222")
	version := func(id uuid.UUID, status codersdk.ProvisionerJobStatus, jobErr string) *codersdk.TemplateVersion {
		v := &codersdk.TemplateVersion{ID: id, Name: "v2", Job: codersdk.ProvisionerJob{Status: status, Error: jobErr}}
		if status != codersdk.ProvisionerJobPending && status != codersdk.ProvisionerJobRunning {
			v.Job.CompletedAt = &done
		}
		return v
	}
	for _, c := range []struct {
		name    string
		b       coderv1alpha1.TemplateBuildRecord
		v       *codersdk.TemplateVersion
		active  uuid.UUID
		ok      bool
		reason  string
		message string
	}{{
		name: "running", v: version(building, codersdk.ProvisionerJobRunning, ""), active: active, ok: true,
		reason: aggv1.ReasonBuilding, message: "template version v2 (" + building.String() + ") is building (job running); the active version " + active.String() + " stays active",
	}, {
		name: "first version pending", v: version(building, codersdk.ProvisionerJobPending, ""), active: building, ok: true,
		reason: aggv1.ReasonBuilding, message: "template version v2 (" + building.String() + ") is building (job pending)",
	}, {
		name: "built, not promoted yet", v: version(building, codersdk.ProvisionerJobSucceeded, ""), active: active, ok: true,
		reason: aggv1.ReasonBuilding, message: "template version v2 (" + building.String() + ") built; it is being made the active version",
	}, {
		name: "built and active", v: version(building, codersdk.ProvisionerJobSucceeded, ""), active: building, ok: false,
	}, {
		name: "failed, recorded with the log", b: coderv1alpha1.TemplateBuildRecord{Failed: true, Error: "terraform init: boom", Log: "Planning: x\nPlanning: y"},
		v: version(building, codersdk.ProvisionerJobFailed, "terraform init: boom"), active: active, ok: true,
		reason:  aggv1.ReasonBuildFailed,
		message: "template version v2 (" + building.String() + ") did not build: terraform init: boom; the active version " + active.String() + " stays active\nlast log lines:\nPlanning: x\nPlanning: y",
	}, {
		name: "failed, not recorded yet", v: version(building, codersdk.ProvisionerJobFailed, "parse error"), active: active, ok: true,
		reason: aggv1.ReasonBuildFailed, message: "template version v2 (" + building.String() + ") did not build: parse error; the active version " + active.String() + " stays active",
	}, {
		name: "timed out", b: coderv1alpha1.TemplateBuildRecord{Failed: true, Error: "the import did not finish within 25m0s"},
		v: version(building, codersdk.ProvisionerJobCanceled, ""), active: active, ok: true,
		reason: aggv1.ReasonBuildFailed, message: "template version v2 (" + building.String() + ") did not build: the import did not finish within 25m0s; the active version " + active.String() + " stays active",
	}} {
		t.Run(c.name, func(t *testing.T) {
			c.b.VersionID, c.b.StartedAt = c.v.ID.String(), started
			got, ok := buildCondition(&c.b, c.v, c.active)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if got.Type != aggv1.ConditionReady || got.Status != metav1.ConditionFalse || got.Reason != c.reason || got.Message != c.message {
				t.Errorf("condition = %s %s %s %q\nwant Ready False %s %q", got.Type, got.Status, got.Reason, got.Message, c.reason, c.message)
			}
			wantAt := started
			if c.v.Job.CompletedAt != nil {
				wantAt = metav1.NewTime(done)
			}
			if !got.LastTransitionTime.Equal(&wantAt) {
				t.Errorf("lastTransitionTime = %s, want %s", got.LastTransitionTime, wantAt)
			}
		})
	}
}

// A request whose own context ended says what it waited for, as a 504,
// instead of blaming coderd.
func TestRequestErrSaysWhatItWaitedFor(t *testing.T) {
	s := &TemplateStorage{genericStore: genericStore{gr: aggv1.Resource("codertemplates"), kind: "CoderTemplate"}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	err := s.requestErr(ctx, target{}, context.DeadlineExceeded, "coder.slow", "coderd to store the template files")
	if !apierrors.IsTimeout(err) {
		t.Fatalf("error %v is not a 504 Timeout", err)
	}
	msg := err.Error()
	for _, want := range []string{"coder.slow", "waited for coderd to store the template files", "context deadline exceeded"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "unreachable") {
		t.Errorf("message blames coderd: %s", msg)
	}
}

// A build's end reaches open watches at once, not at the next poll (ten
// minutes here): the promoter reads the template again when its record's
// build ends, on success and on failure.
func TestBuildEndReachesWatches(t *testing.T) {
	ms := newMetaStackPolling(t, 10*time.Minute)
	name := ms.org + ".promoted"
	in := &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}
	out, err := ms.tpls.Create(ms.ctx, in, nil, &metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created := out.(*aggv1.CoderTemplate)
	if got := readyOf(created); got != "False Building" {
		t.Fatalf("Ready after the create = %q, want False Building", got)
	}
	w, err := ms.tpls.Watch(ms.ctx, &metainternalversion.ListOptions{ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// waitReady waits for a MODIFIED event whose Ready is want.
	waitReady := func(want string) *aggv1.CoderTemplate {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			ev := nextEvent(t, w, name, time.Until(deadline))
			if o, ok := ev.Object.(*aggv1.CoderTemplate); ok && ev.Type == watch.Modified && readyOf(o) == want {
				return o
			}
		}
	}
	start := time.Now()
	ready := waitReady("True Succeeded")
	t.Logf("built and promoted; the watch saw Ready %s after the create", time.Since(start).Round(time.Millisecond))
	if ready.Status.BuildingVersionID != "" || ready.Status.ActiveVersionID != created.Status.ActiveVersionID {
		t.Errorf("after the build: buildingVersionID %q, activeVersionID %q; want none and %s", ready.Status.BuildingVersionID, ready.Status.ActiveVersionID, created.Status.ActiveVersionID)
	}

	broken := ready.DeepCopy()
	broken.Spec.Files = map[string]string{"main.tf": "variable \"x\" {\n  type = nosuchtype\n}\n"}
	if _, _, err := ms.tpls.Update(ms.ctx, name, rest.DefaultUpdatedObjectInfo(broken), nil, nil, false, &metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := waitReady("False BuildFailed")
	if failed.Status.BuildingVersionID == "" || failed.Status.ActiveVersionID != created.Status.ActiveVersionID {
		t.Errorf("after the failed build: buildingVersionID %q, activeVersionID %q; want the failed version and %s still active",
			failed.Status.BuildingVersionID, failed.Status.ActiveVersionID, created.Status.ActiveVersionID)
	}
}
