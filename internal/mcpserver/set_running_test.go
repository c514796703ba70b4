package mcpserver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// workspaceStandInCRD serves coderworkspaces.aggregation.coder.com from
// kube-apiserver itself. The aggregated API would need a coderd; what these
// tests are about, the caller's RBAC and the requests the tools send, is
// the same for a CRD: kube-apiserver checks the caller's rights.
const workspaceStandInCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: coderworkspaces.aggregation.coder.com
spec:
  group: aggregation.coder.com
  scope: Namespaced
  names: {plural: coderworkspaces, singular: coderworkspace, kind: CoderWorkspace, listKind: CoderWorkspaceList}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// TestSetWorkspaceRunningNeedsPatch checks set_workspace_running against
// the caller's RBAC for the requests it sends, a get and a patch: update
// is refused (and changes nothing), patch is enough.
func TestSetWorkspaceRunningNeedsPatch(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "coderworkspaces.yaml"), []byte(workspaceStandInCRD), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, testenv.NewKubeAPI(t, testenv.KubeAPIOptions{CRDDirs: []string{dir}}), nil)
	ctx := context.Background()
	const ns, name = "team", "acme.alice.dev"
	if err := h.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	ws := &aggv1.CoderWorkspace{}
	ws.Namespace, ws.Name = ns, name
	ws.Spec.Running = false
	if err := h.c.Create(ctx, ws); err != nil {
		t.Fatalf("create the workspace: %v", err)
	}
	running := func() bool { return h.workspaceRunning(t, ns, name) }
	rule := func(verb string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{verb}}
	}
	args := map[string]any{"namespace": ns, "name": name, "running": true}

	t.Run("update without patch is refused", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "updater")
		h.grant(t, "agents", "updater", ns, rule("update"), rule("get"))
		res := callTool(t, h.connect(t, token), "set_workspace_running", args, nil)
		want := `User "system:serviceaccount:agents:updater" cannot patch resource "coderworkspaces" in API group "aggregation.coder.com" in the namespace "team"`
		if !res.IsError || !strings.Contains(resultText(res), want) {
			t.Fatalf("result (error %v): %s\nwant an error saying %s", res.IsError, resultText(res), want)
		}
		if running() {
			t.Fatal("the refused call started the workspace")
		}
	})

	t.Run("patch without update is allowed", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "patcher")
		h.grant(t, "agents", "patcher", ns, rule("patch"), rule("get"))
		var out SetRunningResult
		res := callTool(t, h.connect(t, token), "set_workspace_running", args, &out)
		if res.IsError {
			t.Fatalf("set_workspace_running with patch: %s", resultText(res))
		}
		if !out.Changed || !running() {
			t.Fatalf("changed=%v, spec.running now %v; want the workspace started", out.Changed, running())
		}
	})
}

// workspaceRunning reads a workspace's spec.running as the admin.
func (h *harness) workspaceRunning(t *testing.T, namespace, name string) bool {
	t.Helper()
	var got aggv1.CoderWorkspace
	if err := h.c.Get(t.Context(), types.NamespacedName{Namespace: namespace, Name: name}, &got); err != nil {
		t.Fatal(err)
	}
	return got.Spec.Running
}
