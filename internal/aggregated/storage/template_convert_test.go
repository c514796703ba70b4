package storage

import (
	"bytes"
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

var fxFiles = map[string]string{"main.tf": "terraform {}\n", "README.md": "# docker\n"}

func TestToTemplateDeterministic(t *testing.T) {
	for _, prefixed := range []bool{false, true} {
		tgt := fxTarget(t, "prod", prefixed)
		for _, active := range []func() *codersdk.TemplateVersion{fxVersion, func() *codersdk.TemplateVersion { return nil }} {
			a := toTemplate(tgt, fxTemplate(), active(), fxFiles)
			b := toTemplate(tgt, fxTemplate(), active(), fxFiles)
			checkSameConversion(t, prefixed, "two conversions", a, b)
		}
	}
}

// checkSameConversion fails the test unless a and b, two conversions
// (what) of the same input, are deeply equal and marshal to the same
// JSON.
func checkSameConversion(t *testing.T, prefixed bool, what string, a, b any) {
	t.Helper()
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("prefixed=%v: %s differ:\n%#v\n%#v", prefixed, what, a, b)
	}
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ja, jb) {
		t.Fatalf("prefixed=%v: JSON differs:\n%s\n%s", prefixed, ja, jb)
	}
}

func TestToTemplateMapsCoderState(t *testing.T) {
	got := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), fxFiles)
	if got.APIVersion != aggv1.SchemeGroupVersion.String() || got.Kind != "CoderTemplate" {
		t.Errorf("TypeMeta = %+v", got.TypeMeta)
	}
	if got.Name != "acme.docker" || got.Namespace != "team-a" {
		t.Errorf("name = %s/%s, want team-a/acme.docker", got.Namespace, got.Name)
	}
	if got.UID != types.UID(fxTemplateID.String()) {
		t.Errorf("UID = %q", got.UID)
	}
	if want := metav1.NewTime(fxCreated.Truncate(time.Second)); !got.CreationTimestamp.Equal(&want) || got.CreationTimestamp.Nanosecond() != 0 {
		t.Errorf("creationTimestamp = %v, want %v", got.CreationTimestamp, want)
	}
	wantLabels := map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelTemplate: "docker", aggv1.LabelControlPlane: "prod"}
	if !reflect.DeepEqual(got.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", got.Labels, wantLabels)
	}
	wantSpec := aggv1.CoderTemplateSpec{
		Organization: "acme",
		DisplayName:  "Docker",
		Description:  "Docker containers",
		Icon:         "/icon/docker.png",
		VersionID:    fxVersionID.String(),
		Files:        fxFiles,
		// Every setting with Coder's value, durations in metav1.Duration's
		// form (nothing was written through Kubernetes).
		DefaultTTL:                   fxPtr(aggv1.Duration("8h0m0s")),
		ActivityBump:                 fxPtr(aggv1.Duration("1h30m0s")),
		AllowUserCancelWorkspaceJobs: fxPtr(false),
		CORSBehavior:                 aggv1.CORSBehaviorSimple,
		UseClassicParameterFlow:      fxPtr(false),
		AutostopRequirement:          &aggv1.AutostopRequirement{Weeks: 1},
		AutostartRequirement:         &aggv1.AutostartRequirement{DaysOfWeek: codersdk.AllDaysOfWeek},
		AllowUserAutostart:           fxPtr(true),
		AllowUserAutostop:            fxPtr(true),
		FailureTTL:                   fxPtr(aggv1.Duration("0s")),
		TimeTilDormant:               fxPtr(aggv1.Duration("0s")),
		TimeTilDormantAutoDelete:     fxPtr(aggv1.Duration("0s")),
		RequireActiveVersion:         fxPtr(false),
		DeprecationMessage:           fxPtr("use docker-v2"),
		MaxPortShareLevel:            aggv1.PortShareLevelPublic,
	}
	if !reflect.DeepEqual(got.Spec, wantSpec) {
		t.Errorf("spec = %+v\nwant %+v", got.Spec, wantSpec)
	}
	updated := metav1.NewTime(fxTemplateUpdated.Truncate(time.Second))
	wantStatus := aggv1.CoderTemplateStatus{
		ID:                 fxTemplateID.String(),
		Organization:       "acme",
		OrganizationID:     fxOrgID.String(),
		ActiveVersionID:    fxVersionID.String(),
		ActiveVersionName:  "v3",
		BuildStatus:        "succeeded",
		Deprecated:         true,
		DeprecationMessage: "use docker-v2",
		ActiveUserCount:    7,
		UpdatedAt:          &updated,
		Conditions: []metav1.Condition{{
			Type:               aggv1.ConditionReady,
			Status:             metav1.ConditionTrue,
			Reason:             "Succeeded",
			Message:            "the active version v3 built successfully",
			LastTransitionTime: metav1.NewTime(fxVersionCompleted.Truncate(time.Second)),
		}},
	}
	if !reflect.DeepEqual(got.Status, wantStatus) {
		t.Errorf("status = %+v\nwant %+v", got.Status, wantStatus)
	}
}

func TestToTemplateNamesAndLabels(t *testing.T) {
	for _, tc := range []struct {
		controlPlane string
		prefixed     bool
		name         string
		labels       map[string]string
	}{
		{"prod", false, "acme.my_tpl", map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelTemplate: "my_tpl", aggv1.LabelControlPlane: "prod"}},
		{"prod", true, "prod.acme.my_tpl", map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelTemplate: "my_tpl", aggv1.LabelControlPlane: "prod"}},
		{"", false, "acme.my_tpl", map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelTemplate: "my_tpl"}},
	} {
		tpl := fxTemplate()
		tpl.Name = "my_tpl"
		got := toTemplate(fxTarget(t, tc.controlPlane, tc.prefixed), tpl, fxVersion(), nil)
		if got.Name != tc.name {
			t.Errorf("controlPlane %q prefixed %v: name %q, want %q", tc.controlPlane, tc.prefixed, got.Name, tc.name)
		}
		if !reflect.DeepEqual(got.Labels, tc.labels) {
			t.Errorf("controlPlane %q: labels %v, want %v", tc.controlPlane, got.Labels, tc.labels)
		}
		n, err := parseTemplateName(got.Name)
		if err != nil {
			t.Fatalf("name %q does not parse: %v", got.Name, err)
		}
		if n.Org != "acme" || n.Name != "my_tpl" || (tc.prefixed && n.ControlPlane != tc.controlPlane) {
			t.Errorf("name %q parses to %+v", got.Name, n)
		}
		if got.Spec.Files != nil {
			t.Errorf("spec.files = %v, want nil", got.Spec.Files)
		}
	}
}

// fxVersionJob returns fxVersion with its build's job in status, with
// error jobErr, and completed (fxVersion's completion time) or not.
func fxVersionJob(status codersdk.ProvisionerJobStatus, jobErr string, completed bool) func() *codersdk.TemplateVersion {
	return func() *codersdk.TemplateVersion {
		v := fxVersion()
		v.Job.Status, v.Job.Error = status, jobErr
		if !completed {
			v.Job.CompletedAt = nil
		}
		return v
	}
}

func TestToTemplateReadyCondition(t *testing.T) {
	for _, tc := range []struct {
		name      string
		active    func() *codersdk.TemplateVersion
		status    metav1.ConditionStatus
		reason    string
		message   string
		at        time.Time
		build     string
		buildErr  string
		versionNm string
	}{
		{
			name: "succeeded", active: fxVersion,
			status: metav1.ConditionTrue, reason: "Succeeded", message: "the active version v3 built successfully",
			at: fxVersionCompleted, build: "succeeded", versionNm: "v3",
		},
		{
			name:   "failed",
			active: fxVersionJob(codersdk.ProvisionerJobFailed, "terraform init: no provider", true),
			status: metav1.ConditionFalse, reason: "Failed", message: "terraform init: no provider",
			at: fxVersionCompleted, build: "failed", buildErr: "terraform init: no provider", versionNm: "v3",
		},
		{
			name:   "running",
			active: fxVersionJob(codersdk.ProvisionerJobRunning, "", false),
			status: metav1.ConditionFalse, reason: "Running", message: "the active version's build is running",
			at: fxVersionCreated, build: "running", versionNm: "v3",
		},
		{
			name:   "pending",
			active: fxVersionJob(codersdk.ProvisionerJobPending, "", false),
			status: metav1.ConditionFalse, reason: "Pending", message: "the active version's build is pending",
			at: fxVersionCreated, build: "pending", versionNm: "v3",
		},
		{
			name:   "canceled",
			active: fxVersionJob(codersdk.ProvisionerJobCanceled, "", true),
			status: metav1.ConditionFalse, reason: "Canceled", message: "the active version's build is canceled",
			at: fxVersionCompleted, build: "canceled", versionNm: "v3",
		},
		{
			name: "no active version", active: func() *codersdk.TemplateVersion { return nil },
			status: metav1.ConditionUnknown, reason: "VersionUnknown", message: "the active version could not be read",
			at: fxTemplateUpdated,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toTemplate(fxTarget(t, "prod", false), fxTemplate(), tc.active(), nil)
			if len(got.Status.Conditions) != 1 {
				t.Fatalf("conditions = %+v, want only Ready", got.Status.Conditions)
			}
			c := got.Status.Conditions[0]
			if c.Type != aggv1.ConditionReady || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.message {
				t.Errorf("condition = {%s %s %s %q}, want {Ready %s %s %q}", c.Type, c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.message)
			}
			if want := metav1.NewTime(tc.at.Truncate(time.Second)); !c.LastTransitionTime.Equal(&want) || c.LastTransitionTime.Nanosecond() != 0 {
				t.Errorf("lastTransitionTime = %v, want %v", c.LastTransitionTime, want)
			}
			if got.Status.BuildStatus != tc.build || got.Status.BuildError != tc.buildErr || got.Status.ActiveVersionName != tc.versionNm {
				t.Errorf("buildStatus %q, buildError %q, activeVersionName %q; want %q, %q, %q",
					got.Status.BuildStatus, got.Status.BuildError, got.Status.ActiveVersionName, tc.build, tc.buildErr, tc.versionNm)
			}
		})
	}
}

func TestToTemplateZeroValues(t *testing.T) {
	tpl := fxTemplate()
	tpl.ActiveVersionID = uuid.Nil
	tpl.UpdatedAt = time.Time{}
	got := toTemplate(fxTarget(t, "", false), tpl, nil, nil)
	if got.Spec.VersionID != "" || got.Status.ActiveVersionID != "" {
		t.Errorf("version IDs %q, %q; want empty for the zero UUID", got.Spec.VersionID, got.Status.ActiveVersionID)
	}
	if got.Status.UpdatedAt != nil {
		t.Errorf("status.updatedAt = %v, want nil", got.Status.UpdatedAt)
	}
}
