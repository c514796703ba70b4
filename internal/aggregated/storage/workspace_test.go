package storage

import (
	"reflect"
	"testing"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

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
