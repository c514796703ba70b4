package storage

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

var fxParams = []aggv1.WorkspaceParameter{{Name: "region", Value: "eu"}, {Name: "cpus", Value: "4"}}

func TestToWorkspaceDeterministic(t *testing.T) {
	for _, prefixed := range []bool{false, true} {
		tgt := fxTarget(t, "prod", prefixed)
		a := toWorkspace(tgt, fxWorkspace(), fxParams)
		b := toWorkspace(tgt, fxWorkspace(), fxParams)
		checkSameConversion(t, prefixed, "two conversions of the same workspace", a, b)
		// Converting the very same value again gives the same object too.
		w := fxWorkspace()
		if c, d := toWorkspace(tgt, w, fxParams), toWorkspace(tgt, w, fxParams); !reflect.DeepEqual(c, d) {
			t.Fatalf("prefixed=%v: converting one value twice differs", prefixed)
		}
	}
}

func TestToWorkspaceMapsCoderState(t *testing.T) {
	tgt := fxTarget(t, "prod", false)
	before := tgt.URL.String()
	got := toWorkspace(tgt, fxWorkspace(), fxParams)
	if tgt.URL.String() != before {
		t.Fatalf("toWorkspace changed the shared backend URL to %s", tgt.URL)
	}

	if got.APIVersion != aggv1.SchemeGroupVersion.String() || got.Kind != "CoderWorkspace" {
		t.Errorf("TypeMeta = %+v", got.TypeMeta)
	}
	if got.Name != "acme.alice.dev" || got.Namespace != "team-a" {
		t.Errorf("name = %s/%s, want team-a/acme.alice.dev", got.Namespace, got.Name)
	}
	if got.UID != types.UID(fxWorkspaceID.String()) {
		t.Errorf("UID = %q, want the workspace ID", got.UID)
	}
	if got.DeletionTimestamp != nil || len(got.Finalizers) != 0 {
		t.Errorf("running workspace has deletionTimestamp %v, finalizers %v", got.DeletionTimestamp, got.Finalizers)
	}

	wantSpec := aggv1.CoderWorkspaceSpec{
		Organization:      "acme",
		TemplateName:      "docker",
		TemplateVersionID: fxVersionID.String(),
		Running:           true,
		TTLMillis:         fxPtr(int64(8 * time.Hour / time.Millisecond)),
		AutostartSchedule: fxPtr(fxAutostartSchedule),
		Parameters:        fxParams,
	}
	if !reflect.DeepEqual(got.Spec, wantSpec) {
		t.Errorf("spec = %+v\nwant %+v", got.Spec, wantSpec)
	}

	st := got.Status
	if st.ID != fxWorkspaceID.String() || st.Owner != "alice" || st.Organization != "acme" || st.Template != "docker" ||
		st.TemplateDisplayName != "Docker" || st.Phase != "running" || !st.Outdated || !st.Healthy {
		t.Errorf("status = %+v", st)
	}
	if st.URL != "https://coder.example.com/@alice/dev" {
		t.Errorf("status.url = %q", st.URL)
	}
	lb := st.LatestBuild
	if lb == nil {
		t.Fatal("status.latestBuild is nil")
	}
	wantBuild := aggv1.WorkspaceBuild{
		ID:                  fxBuildID.String(),
		Number:              3,
		Transition:          "start",
		JobStatus:           "succeeded",
		TemplateVersionID:   fxVersionID.String(),
		TemplateVersionName: "v1",
		Initiator:           "bob",
		CreatedAt:           metav1.NewTime(fxBuildQueued.Truncate(time.Second)),
		CompletedAt:         fxPtr(metav1.NewTime(fxBuildCompleted.Truncate(time.Second))),
	}
	if !reflect.DeepEqual(*lb, wantBuild) {
		t.Errorf("status.latestBuild = %+v\nwant %+v", *lb, wantBuild)
	}
}

func TestToWorkspaceStaticBackendURL(t *testing.T) {
	tgt := fxTarget(t, "", false)
	tgt.URL = nil
	if got := toWorkspace(tgt, fxWorkspace(), nil); got.Status.URL != "" {
		t.Errorf("status.url without a backend URL = %q, want empty", got.Status.URL)
	}
	tgt.URL = fxURL(t, "https://coder.example.com")
	w := fxWorkspace()
	w.OwnerName, w.Name = "Alice", "My-WS"
	if got := toWorkspace(tgt, w, nil); got.Status.URL != "https://coder.example.com/@Alice/My-WS" {
		t.Errorf("status.url = %q", got.Status.URL)
	}
}

func TestToWorkspaceNamePrefixedOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		controlPlane string
		prefixed     bool
		want         string
	}{
		{"prod", false, "acme.alice.dev"},
		{"prod", true, "prod.acme.alice.dev"},
		{"", false, "acme.alice.dev"},
	} {
		got := toWorkspace(fxTarget(t, tc.controlPlane, tc.prefixed), fxWorkspace(), nil)
		if got.Name != tc.want {
			t.Errorf("controlPlane %q prefixed %v: name %q, want %q", tc.controlPlane, tc.prefixed, got.Name, tc.want)
		}
		// The name parses back to the workspace it came from.
		n, err := parseWorkspaceName(got.Name)
		if err != nil {
			t.Fatalf("name %q does not parse: %v", got.Name, err)
		}
		wantCP := ""
		if tc.prefixed {
			wantCP = tc.controlPlane
		}
		if n != (workspaceName{ControlPlane: wantCP, Org: "acme", Owner: "alice", Name: "dev"}) {
			t.Errorf("name %q parses to %+v", got.Name, n)
		}
	}
}

func TestToWorkspaceLabels(t *testing.T) {
	for _, tc := range []struct {
		name         string
		controlPlane string
		prefixed     bool
		template     string
		want         map[string]string
	}{
		{
			name: "control plane", controlPlane: "prod", template: "docker",
			want: map[string]string{
				aggv1.LabelOrganization: "acme", aggv1.LabelOwner: "alice",
				aggv1.LabelTemplate: "docker", aggv1.LabelControlPlane: "prod",
			},
		},
		{
			// The label does not depend on the name's prefix.
			name: "control plane, prefixed", controlPlane: "prod", prefixed: true, template: "docker",
			want: map[string]string{
				aggv1.LabelOrganization: "acme", aggv1.LabelOwner: "alice",
				aggv1.LabelTemplate: "docker", aggv1.LabelControlPlane: "prod",
			},
		},
		{
			name: "static backend", template: "docker",
			want: map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelOwner: "alice", aggv1.LabelTemplate: "docker"},
		},
		{
			name: "no template name",
			want: map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelOwner: "alice"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fxWorkspace()
			w.TemplateName = tc.template
			got := toWorkspace(fxTarget(t, tc.controlPlane, tc.prefixed), w, nil)
			if !reflect.DeepEqual(got.Labels, tc.want) {
				t.Errorf("labels = %v, want %v", got.Labels, tc.want)
			}
		})
	}
}

func TestToWorkspaceRunningFollowsLatestTransition(t *testing.T) {
	for _, tc := range []struct {
		transition codersdk.WorkspaceTransition
		job        codersdk.ProvisionerJobStatus
		want       bool
	}{
		{codersdk.WorkspaceTransitionStart, codersdk.ProvisionerJobSucceeded, true},
		{codersdk.WorkspaceTransitionStart, codersdk.ProvisionerJobPending, true},
		{codersdk.WorkspaceTransitionStart, codersdk.ProvisionerJobFailed, true},
		{codersdk.WorkspaceTransitionStop, codersdk.ProvisionerJobSucceeded, false},
		{codersdk.WorkspaceTransitionStop, codersdk.ProvisionerJobRunning, false},
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobFailed, false},
	} {
		w := fxWorkspace()
		w.LatestBuild.Transition = tc.transition
		w.LatestBuild.Job.Status = tc.job
		if got := toWorkspace(fxTarget(t, "prod", false), w, nil).Spec.Running; got != tc.want {
			t.Errorf("%s build %s: spec.running = %v, want %v", tc.transition, tc.job, got, tc.want)
		}
	}
}

func TestToWorkspaceDeletion(t *testing.T) {
	for _, tc := range []struct {
		transition codersdk.WorkspaceTransition
		job        codersdk.ProvisionerJobStatus
		deleting   bool
	}{
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobPending, true},
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobRunning, true},
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobSucceeded, true},
		// Current behaviour: a delete build being canceled still counts as
		// deleting until its job reaches canceled.
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobCanceling, true},
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobFailed, false},
		{codersdk.WorkspaceTransitionDelete, codersdk.ProvisionerJobCanceled, false},
		{codersdk.WorkspaceTransitionStart, codersdk.ProvisionerJobRunning, false},
		{codersdk.WorkspaceTransitionStop, codersdk.ProvisionerJobSucceeded, false},
	} {
		w := fxWorkspace()
		w.LatestBuild.Transition = tc.transition
		w.LatestBuild.Job.Status = tc.job
		got := toWorkspace(fxTarget(t, "prod", false), w, nil)
		if !tc.deleting {
			if got.DeletionTimestamp != nil || got.Finalizers != nil {
				t.Errorf("%s build %s: deletionTimestamp %v, finalizers %v; want neither", tc.transition, tc.job, got.DeletionTimestamp, got.Finalizers)
			}
			continue
		}
		want := metav1.NewTime(fxBuildQueued.Truncate(time.Second))
		if got.DeletionTimestamp == nil || !got.DeletionTimestamp.Equal(&want) {
			t.Errorf("%s build %s: deletionTimestamp %v, want %v (the build's creation, in seconds)", tc.transition, tc.job, got.DeletionTimestamp, want)
		}
		if !reflect.DeepEqual(got.Finalizers, []string{FinalizerDeleteBuild}) {
			t.Errorf("%s build %s: finalizers %v, want [%s]", tc.transition, tc.job, got.Finalizers, FinalizerDeleteBuild)
		}
	}
	if FinalizerDeleteBuild != "aggregation.coder.com/delete-build" {
		t.Errorf("FinalizerDeleteBuild = %q", FinalizerDeleteBuild)
	}
}

func conditionOf(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

func TestToWorkspaceConditions(t *testing.T) {
	type cond struct {
		status          metav1.ConditionStatus
		reason, message string
	}
	for _, tc := range []struct {
		name       string
		transition codersdk.WorkspaceTransition
		job        codersdk.ProvisionerJobStatus
		status     codersdk.WorkspaceStatus
		jobErr     string
		completed  bool
		ready      cond
		building   cond
		// reconciling and stalled True (False otherwise): what kstatus
		// reads.
		reconciling, stalled bool
	}{
		{
			name: "start succeeded", transition: codersdk.WorkspaceTransitionStart, job: codersdk.ProvisionerJobSucceeded,
			status: codersdk.WorkspaceStatusRunning, completed: true,
			ready:    cond{metav1.ConditionTrue, "Running", "the workspace is running (it has no agents)"},
			building: cond{metav1.ConditionFalse, "Succeeded", "the last start build succeeded"},
		},
		{
			name: "start running", transition: codersdk.WorkspaceTransitionStart, job: codersdk.ProvisionerJobRunning,
			status:      codersdk.WorkspaceStatusStarting,
			ready:       cond{metav1.ConditionFalse, "Starting", "the workspace is starting"},
			building:    cond{metav1.ConditionTrue, "Running", "a start build is running"},
			reconciling: true,
		},
		{
			name: "stop pending", transition: codersdk.WorkspaceTransitionStop, job: codersdk.ProvisionerJobPending,
			status:      codersdk.WorkspaceStatusPending,
			ready:       cond{metav1.ConditionFalse, "Pending", "the workspace is pending"},
			building:    cond{metav1.ConditionTrue, "Pending", "a stop build is pending"},
			reconciling: true,
		},
		{
			name: "start canceling", transition: codersdk.WorkspaceTransitionStart, job: codersdk.ProvisionerJobCanceling,
			status:      codersdk.WorkspaceStatusCanceling,
			ready:       cond{metav1.ConditionFalse, "Canceling", "the workspace is canceling"},
			building:    cond{metav1.ConditionTrue, "Canceling", "a start build is canceling"},
			reconciling: true,
		},
		{
			name: "start failed", transition: codersdk.WorkspaceTransitionStart, job: codersdk.ProvisionerJobFailed,
			status: codersdk.WorkspaceStatusFailed, jobErr: "terraform apply: boom", completed: true,
			ready:    cond{metav1.ConditionFalse, "BuildFailed", "terraform apply: boom"},
			building: cond{metav1.ConditionFalse, "Failed", "the last start build failed"},
			stalled:  true,
		},
		{
			name: "stop succeeded", transition: codersdk.WorkspaceTransitionStop, job: codersdk.ProvisionerJobSucceeded,
			status: codersdk.WorkspaceStatusStopped, completed: true,
			ready:    cond{metav1.ConditionFalse, "Stopped", "the workspace is stopped"},
			building: cond{metav1.ConditionFalse, "Succeeded", "the last stop build succeeded"},
		},
		{
			name: "start canceled", transition: codersdk.WorkspaceTransitionStart, job: codersdk.ProvisionerJobCanceled,
			status: codersdk.WorkspaceStatusCanceled, completed: true,
			ready:    cond{metav1.ConditionFalse, "Canceled", "the workspace is canceled"},
			building: cond{metav1.ConditionFalse, "Canceled", "the last start build canceled"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := fxWorkspace()
			b := &w.LatestBuild
			b.Transition, b.Job.Status, b.Status, b.Job.Error = tc.transition, tc.job, tc.status, tc.jobErr
			wantAt := metav1.NewTime(fxBuildQueued.Truncate(time.Second))
			if tc.completed {
				wantAt = metav1.NewTime(fxBuildCompleted.Truncate(time.Second))
			} else {
				b.Job.CompletedAt = nil
			}
			got := toWorkspace(fxTarget(t, "prod", false), w, nil)
			if len(got.Status.Conditions) != 4 {
				t.Fatalf("conditions = %+v, want Ready, Building, Reconciling and Stalled", got.Status.Conditions)
			}
			reconciling := cond{metav1.ConditionFalse, "Settled", "no build runs and the agents are settled"}
			if tc.reconciling {
				reconciling = cond{metav1.ConditionTrue, tc.building.reason, tc.building.message}
			}
			stalled := cond{metav1.ConditionFalse, "NotStalled", "nothing failed"}
			if tc.stalled {
				stalled = cond{metav1.ConditionTrue, tc.ready.reason, tc.ready.message}
			}
			for typ, want := range map[string]cond{aggv1.ConditionReady: tc.ready, aggv1.ConditionBuilding: tc.building,
				aggv1.ConditionReconciling: reconciling, aggv1.ConditionStalled: stalled} {
				c := conditionOf(got.Status.Conditions, typ)
				if c == nil {
					t.Fatalf("no %s condition in %+v", typ, got.Status.Conditions)
				}
				if c.Status != want.status || c.Reason != want.reason || c.Message != want.message {
					t.Errorf("%s = {%s %s %q}, want {%s %s %q}", typ, c.Status, c.Reason, c.Message, want.status, want.reason, want.message)
				}
				if !c.LastTransitionTime.Equal(&wantAt) {
					t.Errorf("%s lastTransitionTime = %v, want %v", typ, c.LastTransitionTime, wantAt)
				}
			}
		})
	}
}

func TestReasonFor(t *testing.T) {
	for in, want := range map[string]string{
		"":            "Unknown",
		"running":     "Running",
		"succeeded":   "Succeeded",
		"canceling":   "Canceling",
		"build_fail":  "BuildFail",
		"not-started": "NotStarted",
		"two words":   "TwoWords",
		"Already":     "Already",
		"a__b":        "AB",
	} {
		if got := reasonFor(in); got != want {
			t.Errorf("reasonFor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestToWorkspaceTimesTruncatedToSeconds(t *testing.T) {
	got := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	times := map[string]*metav1.Time{
		"metadata.creationTimestamp":   &got.CreationTimestamp,
		"status.lastUsedAt":            got.Status.LastUsedAt,
		"status.autoShutdownDeadline":  got.Status.AutoShutdownDeadline,
		"status.latestBuild.createdAt": &got.Status.LatestBuild.CreatedAt,
		"status.latestBuild.completed": got.Status.LatestBuild.CompletedAt,
	}
	for i, c := range got.Status.Conditions {
		times["status.conditions["+c.Type+"]"] = &got.Status.Conditions[i].LastTransitionTime
	}
	want := map[string]time.Time{
		"metadata.creationTimestamp":     fxCreated,
		"status.lastUsedAt":              fxLastUsed,
		"status.autoShutdownDeadline":    fxDeadline,
		"status.latestBuild.createdAt":   fxBuildQueued,
		"status.latestBuild.completed":   fxBuildCompleted,
		"status.conditions[Ready]":       fxBuildCompleted,
		"status.conditions[Building]":    fxBuildCompleted,
		"status.conditions[Reconciling]": fxBuildCompleted,
		"status.conditions[Stalled]":     fxBuildCompleted,
	}
	for name, tm := range times {
		if tm == nil {
			t.Errorf("%s is nil", name)
			continue
		}
		if tm.Nanosecond() != 0 {
			t.Errorf("%s = %v has sub-second digits", name, tm.Time)
		}
		if w := want[name].Truncate(time.Second); !tm.Time.Equal(w) {
			t.Errorf("%s = %v, want %v", name, tm.Time, w)
		}
	}
	// What the API serializes is what DeepEqual compares: a JSON round trip
	// keeps every time.
	raw, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var back aggv1.CoderWorkspace
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !back.CreationTimestamp.Equal(&got.CreationTimestamp) || !back.Status.LastUsedAt.Equal(got.Status.LastUsedAt) ||
		!back.Status.LatestBuild.CreatedAt.Equal(&got.Status.LatestBuild.CreatedAt) {
		t.Errorf("times changed in a JSON round trip")
	}
}

func TestToWorkspaceOptionalTimesAndBuild(t *testing.T) {
	t.Run("no last use", func(t *testing.T) {
		w := fxWorkspace()
		w.LastUsedAt = time.Time{}
		if got := toWorkspace(fxTarget(t, "prod", false), w, nil); got.Status.LastUsedAt != nil {
			t.Errorf("status.lastUsedAt = %v, want nil", got.Status.LastUsedAt)
		}
	})
	t.Run("build not completed", func(t *testing.T) {
		w := fxWorkspace()
		w.LatestBuild.Job.CompletedAt = nil
		w.LatestBuild.Job.Status = codersdk.ProvisionerJobRunning
		if got := toWorkspace(fxTarget(t, "prod", false), w, nil); got.Status.LatestBuild.CompletedAt != nil {
			t.Errorf("completedAt = %v, want nil", got.Status.LatestBuild.CompletedAt)
		}
	})
	t.Run("deadline only for start builds", func(t *testing.T) {
		w := fxWorkspace()
		w.LatestBuild.Transition = codersdk.WorkspaceTransitionStop
		if got := toWorkspace(fxTarget(t, "prod", false), w, nil); got.Status.AutoShutdownDeadline != nil {
			t.Errorf("stop build: autoShutdownDeadline = %v, want nil", got.Status.AutoShutdownDeadline)
		}
		w = fxWorkspace()
		w.LatestBuild.Deadline = codersdk.NullTime{}
		if got := toWorkspace(fxTarget(t, "prod", false), w, nil); got.Status.AutoShutdownDeadline != nil {
			t.Errorf("no deadline: autoShutdownDeadline = %v, want nil", got.Status.AutoShutdownDeadline)
		}
	})
	t.Run("no build", func(t *testing.T) {
		w := fxWorkspace()
		w.LatestBuild = codersdk.WorkspaceBuild{}
		got := toWorkspace(fxTarget(t, "prod", false), w, nil)
		if got.Status.LatestBuild != nil || got.Status.AutoShutdownDeadline != nil {
			t.Errorf("latestBuild %+v, deadline %v; want nil for a workspace without build", got.Status.LatestBuild, got.Status.AutoShutdownDeadline)
		}
		if got.Spec.TemplateVersionID != "" {
			t.Errorf("spec.templateVersionID = %q, want empty for the zero UUID", got.Spec.TemplateVersionID)
		}
	})
	t.Run("zero template version", func(t *testing.T) {
		w := fxWorkspace()
		w.LatestBuild.TemplateVersionID = uuid.Nil
		got := toWorkspace(fxTarget(t, "prod", false), w, nil)
		if got.Spec.TemplateVersionID != "" || got.Status.LatestBuild.TemplateVersionID != "" {
			t.Errorf("template version IDs %q, %q; want empty", got.Spec.TemplateVersionID, got.Status.LatestBuild.TemplateVersionID)
		}
	})
	t.Run("no schedule", func(t *testing.T) {
		w := fxWorkspace()
		w.TTLMillis, w.AutostartSchedule = nil, nil
		got := toWorkspace(fxTarget(t, "prod", false), w, nil)
		if got.Spec.TTLMillis != nil || got.Spec.AutostartSchedule != nil {
			t.Errorf("ttl %v, autostart %v; want nil", got.Spec.TTLMillis, got.Spec.AutostartSchedule)
		}
	})
}

func TestCoderdOwnsStatus(t *testing.T) {
	check := func(t *testing.T, mf []metav1.ManagedFieldsEntry) {
		t.Helper()
		if len(mf) != 1 {
			t.Fatalf("managedFields = %+v, want one entry", mf)
		}
		e := mf[0]
		if e.Manager != "coderd" || e.Operation != metav1.ManagedFieldsOperationUpdate ||
			e.APIVersion != aggv1.SchemeGroupVersion.String() || e.FieldsType != "FieldsV1" || e.Subresource != "" {
			t.Errorf("managedFields entry = %+v", e)
		}
		if e.FieldsV1 == nil || e.FieldsV1.GetRawString() != `{"f:status":{}}` {
			t.Errorf("fieldsV1 = %v, want {\"f:status\":{}}", e.FieldsV1)
		}
		if e.Time != nil {
			t.Errorf("managedFields time = %v; a time would make the object change on every poll", e.Time)
		}
	}
	t.Run("workspace", func(t *testing.T) {
		check(t, toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil).ManagedFields)
	})
	t.Run("template", func(t *testing.T) {
		check(t, toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), nil).ManagedFields)
	})
	t.Run("not shared", func(t *testing.T) {
		a := coderdOwnsStatus()
		a[0].Manager = "someone-else"
		a[0].FieldsV1.SetRawString(`{"f:spec":{}}`)
		check(t, coderdOwnsStatus())
	})
}

func TestDeletingAndBuildInProgress(t *testing.T) {
	inProgress := map[codersdk.ProvisionerJobStatus]bool{
		codersdk.ProvisionerJobPending:   true,
		codersdk.ProvisionerJobRunning:   true,
		codersdk.ProvisionerJobCanceling: true,
		codersdk.ProvisionerJobSucceeded: false,
		codersdk.ProvisionerJobCanceled:  false,
		codersdk.ProvisionerJobFailed:    false,
		codersdk.ProvisionerJobUnknown:   false,
	}
	for s, want := range inProgress {
		if got := buildInProgress(s); got != want {
			t.Errorf("buildInProgress(%s) = %v, want %v", s, got, want)
		}
		for _, tr := range []codersdk.WorkspaceTransition{codersdk.WorkspaceTransitionStart, codersdk.WorkspaceTransitionStop} {
			if deleting(&codersdk.WorkspaceBuild{Transition: tr, Job: codersdk.ProvisionerJob{Status: s}}) {
				t.Errorf("a %s build %s counts as deleting", tr, s)
			}
		}
	}
}
