package storage

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
)

func TestTargetsOf(t *testing.T) {
	bs := []backend.Backend{
		{Namespace: "a", ControlPlane: "one"},
		{Namespace: "b", ControlPlane: "one"},
		{Namespace: "b", ControlPlane: "two"},
		{Namespace: "c", ControlPlane: ""},
		{Namespace: "d", ControlPlane: "x"},
		{Namespace: "d", ControlPlane: "y"},
		{Namespace: "d", ControlPlane: "z"},
	}
	got := targetsOf(bs)
	want := []bool{false, true, true, false, true, true, true}
	if len(got) != len(bs) {
		t.Fatalf("targetsOf returned %d targets for %d backends", len(got), len(bs))
	}
	for i, tg := range got {
		if tg.Key() != bs[i].Key() || tg.Client != bs[i].Client {
			t.Errorf("target %d is %+v, want %+v (same order)", i, tg.Backend, bs[i])
		}
		if tg.prefixed != want[i] {
			t.Errorf("target %s: prefixed %v, want %v", tg.Key(), tg.prefixed, want[i])
		}
	}
	// Only the namespace matters: one backend per namespace is never
	// prefixed, whatever the other namespaces hold.
	for _, tg := range targetsOf([]backend.Backend{{Namespace: "a", ControlPlane: "one"}}) {
		if tg.prefixed {
			t.Error("the only backend of a namespace is prefixed")
		}
	}
	if got := targetsOf(nil); len(got) != 0 {
		t.Errorf("targetsOf(nil) = %v", got)
	}
}

func fxResource(p backend.Provider) *resource {
	return &resource{gr: aggv1.Resource("coderworkspaces"), kind: "CoderWorkspace", backends: p}
}

func TestResolve(t *testing.T) {
	ctx := context.Background()
	p := fxProvider{backends: []backend.Backend{
		{Namespace: "single", ControlPlane: "only"},
		{Namespace: "multi", ControlPlane: "zeta"},
		{Namespace: "multi", ControlPlane: "alpha"},
		{Namespace: "static", ControlPlane: ""},
	}}
	r := fxResource(p)
	for _, tc := range []struct {
		name, namespace, controlPlane string
		want                          string // backend key on success
		wantPrefixed                  bool
		notFound                      []string // substrings of the NotFound message
	}{
		{name: "single, unprefixed", namespace: "single", want: "single/only"},
		{name: "static, unprefixed", namespace: "static", want: "static/"},
		{name: "multi, prefixed", namespace: "multi", controlPlane: "alpha", want: "multi/alpha", wantPrefixed: true},
		{name: "multi, other prefix", namespace: "multi", controlPlane: "zeta", want: "multi/zeta", wantPrefixed: true},
		{name: "empty namespace", namespace: "none", notFound: []string{`namespace "none" has no CoderControlPlane with ready operator access`}},
		{name: "multi, unprefixed", namespace: "multi", notFound: []string{"has several control planes (alpha, zeta)", "prefix the name"}},
		{name: "single, prefixed", namespace: "single", controlPlane: "only", notFound: []string{"has one control plane", `without the "only" prefix`}},
		{name: "multi, unknown prefix", namespace: "multi", controlPlane: "beta", notFound: []string{`no control plane "beta"`, "(it has alpha, zeta)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.resolve(ctx, tc.namespace, tc.controlPlane, "obj")
			if tc.notFound != nil {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("resolve = %+v, %v; want NotFound", got, err)
				}
				for _, s := range tc.notFound {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				if !strings.Contains(err.Error(), `"obj" not found`) {
					t.Errorf("error %q does not name the object", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Key() != tc.want || got.prefixed != tc.wantPrefixed {
				t.Errorf("resolve = %s (prefixed %v), want %s (prefixed %v)", got.Key(), got.prefixed, tc.want, tc.wantPrefixed)
			}
		})
	}

	t.Run("provider error", func(t *testing.T) {
		r := fxResource(fxProvider{err: errors.New("informers not synced")})
		_, err := r.resolve(ctx, "single", "", "obj")
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "informers not synced") {
			t.Errorf("resolve = %v, want ServiceUnavailable naming the cause", err)
		}
	})
}

func TestResolveAgreesWithNames(t *testing.T) {
	// The name toWorkspace gives an object resolves back to its backend.
	ctx := context.Background()
	bs := []backend.Backend{{Namespace: "team-a", ControlPlane: "prod"}, {Namespace: "team-a", ControlPlane: "dev"}, {Namespace: "team-b", ControlPlane: "prod"}}
	r := fxResource(fxProvider{backends: bs})
	for _, tg := range targetsOf(bs) {
		obj := toWorkspace(tg, fxWorkspace(), nil)
		n, err := parseWorkspaceName(obj.Name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.resolve(ctx, obj.Namespace, n.ControlPlane, obj.Name)
		if err != nil {
			t.Fatalf("%s: %v", obj.Name, err)
		}
		if got.Key() != tg.Key() {
			t.Errorf("%s/%s resolves to %s, want %s", obj.Namespace, obj.Name, got.Key(), tg.Key())
		}
	}
}

func TestCheckResourceVersion(t *testing.T) {
	r := fxResource(nil)
	const cur = "0123456789ab.17.00000001e240"
	for _, tc := range []struct {
		given    string
		conflict bool
	}{
		{"", false},
		{cur, false},
		// Same content (fingerprint), stamped by another replica or
		// before a restart.
		{"ba9876543210.5.00000001e240", false},
		{"0123456789ab.17.00000001e241", true},
		// A list version describes no content.
		{"0123456789ab.17", true},
		// The previous binary's decimal format.
		{"1700000000000123456", true},
		{"abc", true},
	} {
		err := r.checkResourceVersion("obj", tc.given, cur)
		if got := apierrors.IsConflict(err); got != tc.conflict || (!tc.conflict && err != nil) {
			t.Errorf("checkResourceVersion(%q, %q) = %v, want conflict %v", tc.given, cur, err, tc.conflict)
		}
	}
}

func TestCheckDeletePreconditions(t *testing.T) {
	r := fxResource(nil)
	cur := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	cur.ResourceVersion = "0123456789ab.17.00000001e240"
	uid, otherUID := cur.UID, types.UID("other")
	for _, tc := range []struct {
		name     string
		opts     *metav1.DeleteOptions
		conflict bool
	}{
		{"no options", nil, false},
		{"no preconditions", &metav1.DeleteOptions{}, false},
		{"matching UID", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}, false},
		{"other UID", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &otherUID}}, true},
		{"matching resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: fxPtr("ba9876543210.5.00000001e240")}}, false},
		{"stale resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: fxPtr("0123456789ab.17.000000000001")}}, true},
		{"matching UID, stale resourceVersion", &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: fxPtr("1")}}, true},
	} {
		err := r.checkDeletePreconditions(cur.Name, cur, tc.opts)
		if apierrors.IsConflict(err) != tc.conflict || (!tc.conflict && err != nil) {
			t.Errorf("%s: %v, want conflict %v", tc.name, err, tc.conflict)
		}
	}
}

func TestBadNameIsNotFound(t *testing.T) {
	r := fxResource(nil)
	_, perr := parseWorkspaceName("nope")
	err := r.badName("nope", perr)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("badName = %v, want NotFound", err)
	}
	if !strings.Contains(err.Error(), "<organization>.<owner>.<workspace>") {
		t.Errorf("badName message %q does not tell the expected format", err)
	}
	var se *apierrors.StatusError
	if !errors.As(err, &se) || se.ErrStatus.Details == nil || se.ErrStatus.Details.Name != "nope" || se.ErrStatus.Details.Kind != "coderworkspaces" {
		t.Errorf("status details = %+v", se.ErrStatus.Details)
	}
}

func TestInNamespace(t *testing.T) {
	if inNamespace("") != nil {
		t.Error(`inNamespace("") is not nil (all namespaces)`)
	}
	f := inNamespace("team")
	for key, want := range map[string]bool{"team/prod": true, "team/": true, "team-b/prod": false, "teamx/": false, "other/team": false} {
		if f(key) != want {
			t.Errorf("inNamespace(team)(%q) = %v, want %v", key, !want, want)
		}
	}
}

func TestControlPlaneNamesSorted(t *testing.T) {
	ts := []target{{Backend: backend.Backend{ControlPlane: "b"}}, {Backend: backend.Backend{ControlPlane: "a"}}, {Backend: backend.Backend{ControlPlane: "c"}}}
	if got := controlPlaneNames(ts); got != "a, b, c" {
		t.Errorf("controlPlaneNames = %q", got)
	}
	if ts[0].ControlPlane != "b" {
		t.Error("controlPlaneNames reordered its argument")
	}
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

func TestCreateOptions(t *testing.T) {
	if got := createOptions(nil); got == nil || !reflect.DeepEqual(*got, metav1.CreateOptions{}) {
		t.Errorf("createOptions(nil) = %+v", got)
	}
	got := createOptions(&metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kubectl", FieldValidation: "Strict"})
	want := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kubectl", FieldValidation: "Strict"}
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("createOptions = %+v, want %+v", *got, want)
	}
	if !isDryRun(got.DryRun) || isDryRun(nil) {
		t.Error("isDryRun")
	}
}

func TestDryRunWorkspace(t *testing.T) {
	in := fxNewWorkspace("prod.acme.alice.dev")
	in.Labels = map[string]string{"mine": "yes"}
	tg := fxTarget(t, "prod", true)
	out := dryRunWorkspace(in, tg, workspaceName{ControlPlane: "prod", Org: "acme", Owner: "alice", Name: "dev"})
	if out == in {
		t.Fatal("dryRunWorkspace returned its input")
	}
	if in.Namespace != "" || in.Spec.Organization != "" || in.Labels["mine"] != "yes" {
		t.Errorf("dryRunWorkspace changed its input: %+v", in)
	}
	if out.Namespace != "team-a" || out.Spec.Organization != "acme" || out.Name != "prod.acme.alice.dev" {
		t.Errorf("dry run object = %s/%s org %q", out.Namespace, out.Name, out.Spec.Organization)
	}
	wantLabels := map[string]string{aggv1.LabelOrganization: "acme", aggv1.LabelOwner: "alice", aggv1.LabelTemplate: "docker", aggv1.LabelControlPlane: "prod"}
	if !reflect.DeepEqual(out.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v (the server's labels, as a real create gives)", out.Labels, wantLabels)
	}
	if out.Status.Owner != "alice" || out.Status.Organization != "acme" || out.Status.Template != "docker" {
		t.Errorf("status = %+v", out.Status)
	}
	if out.CreationTimestamp.IsZero() {
		t.Error("no creationTimestamp")
	}
}
