package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestWorkspaceReady runs workspaces of the Kubernetes template on the
// test node and checks what a user sees of their readiness: `kubectl wait
// --for=condition=Ready` as a mapped member returns only once coderd has
// the agent connected and ready, status.agents lists the agent and its
// app as coderd has them, the table shows READY and AGENTS; a stop makes
// Ready False (Stopped); a workspace whose image does not exist is
// Ready=False, and a GET by a caller who may list pods in the namespace
// names the pod's ErrImagePull or ImagePullBackOff within a minute of its
// build, while one who may not sees no pod; MCP's diagnose_workspace
// gives the pod, its events and the build log's end.
func TestWorkspaceReady(t *testing.T) {
	t.Parallel()
	s := newNodeStack(t)
	ctx := t.Context()
	alice := s.nodeMember(t, "alice")
	getWS := func(t *testing.T, name string) *aggv1.CoderWorkspace {
		t.Helper()
		r, err := alice.Run(ctx, "", "get", "cws", name, "-n", s.ns, "-o", "json")
		if err != nil {
			t.Fatalf("kubectl get cws %s: %v\n%s", name, err, r.Combined)
		}
		var w aggv1.CoderWorkspace
		if err := json.Unmarshal([]byte(r.Stdout), &w); err != nil {
			t.Fatal(err)
		}
		return &w
	}
	create := func(t *testing.T, name, template string) string {
		t.Helper()
		kname := s.org + ".alice." + name
		if r, err := alice.Run(ctx, "", "create", "-f", runningWorkspaceManifest(t, kname, s.ns, template)); err != nil {
			t.Fatalf("kubectl create as alice@example.com: %v\n%s", err, r.Combined)
		}
		return kname
	}

	const name = "ready"
	kname := create(t, name, kubernetesTemplate)

	t.Run("kubectl wait --for=condition=Ready returns once the agent is connected and ready", func(t *testing.T) {
		start := time.Now()
		if r, err := alice.Run(ctx, "", "wait", "--for=condition=Ready", "cws/"+kname, "-n", s.ns, "--timeout=5m"); err != nil {
			t.Fatalf("kubectl wait: %v\n%s\noperator log:\n%s", err, r.Combined, s.op.LogTail(30))
		}
		t.Logf("kubectl create → kubectl wait --for=condition=Ready returned: %s", time.Since(start).Round(100*time.Millisecond))
		ws, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, "alice", name, codersdk.WorkspaceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if why := testenv.AgentsNotReady(ws); why != "" {
			t.Fatalf("kubectl wait returned but coderd says the workspace is not usable: %s", why)
		}
		w := getWS(t, kname)
		c := meta.FindStatusCondition(w.Status.Conditions, aggv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != aggv1.ReasonAgentsReady {
			t.Errorf("Ready = %+v, want True AgentsReady", c)
		}
		var a codersdk.WorkspaceAgent
		for _, r := range ws.LatestBuild.Resources {
			if len(r.Agents) > 0 {
				a = r.Agents[0]
			}
		}
		if len(w.Status.Agents) != 1 {
			t.Fatalf("status.agents = %+v, want coderd's one agent %s", w.Status.Agents, a.Name)
		}
		got := w.Status.Agents[0]
		if got.Name != a.Name || got.ID != a.ID.String() || got.Status != "connected" || got.LifecycleState != "ready" || !got.Healthy {
			t.Errorf("status.agents[0] = %+v, want %s connected, ready and healthy", got, a.Name)
		}
		if len(got.Apps) == 0 || len(got.Apps) != len(a.Apps) {
			t.Fatalf("apps = %+v, want coderd's %d apps", got.Apps, len(a.Apps))
		}
		for i, app := range a.Apps {
			g := got.Apps[i]
			wantURL := s.coder.URL.String() + "/@alice/" + name + "." + a.Name + "/apps/" + app.Slug + "/"
			if g.Slug != app.Slug || g.DisplayName != app.DisplayName || g.URL != wantURL {
				t.Errorf("app %d = %+v, want slug %s, name %q, url %s", i, g, app.Slug, app.DisplayName, wantURL)
			}
		}
		r, err := alice.Run(ctx, "", "get", "cws", kname, "-n", s.ns)
		if err != nil {
			t.Fatalf("%v\n%s", err, r.Combined)
		}
		if cells := tableRow(t, r.Stdout, kname); cells["READY"] != "True" || cells["AGENTS"] != "1/1" {
			t.Errorf("kubectl get cws: READY %q AGENTS %q, want True and 1/1:\n%s", cells["READY"], cells["AGENTS"], r.Stdout)
		}
	})

	t.Run("a stop makes Ready False with reason Stopped", func(t *testing.T) {
		if r, err := alice.Run(ctx, "", "patch", "cws", kname, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":false}}`); err != nil {
			t.Fatalf("%v\n%s", err, r.Combined)
		}
		if r, err := alice.Run(ctx, "", "wait", "--for=jsonpath={.status.phase}=stopped", "cws/"+kname, "-n", s.ns, "--timeout=3m"); err != nil {
			t.Fatalf("kubectl wait for stopped: %v\n%s", err, r.Combined)
		}
		w := getWS(t, kname)
		c := meta.FindStatusCondition(w.Status.Conditions, aggv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Stopped" || len(w.Status.Agents) != 0 {
			t.Errorf("stopped: Ready %+v, agents %+v; want False Stopped and no agents", c, w.Status.Agents)
		}
	})

	// A template whose pods use an image the node's registry does not have.
	const badTemplate = "kubernetes-noimage"
	badImage := s.node.image[:strings.LastIndex(s.node.image, ":")] + ":does-not-exist"
	if _, err := s.coder.PushTemplate(ctx, badTemplate, testenv.KubernetesTemplate(testenv.KubernetesTemplateOptions{Namespace: s.ns, Image: badImage})); err != nil {
		t.Fatal(err)
	}
	const bad = "noimage"
	bname := create(t, bad, badTemplate)
	var built time.Time
	testenv.WaitFor(t, 3*time.Minute, func() error {
		ws, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, "alice", bad, codersdk.WorkspaceOptions{})
		if err != nil {
			return err
		}
		if b := ws.LatestBuild; b.Job.Status != codersdk.ProvisionerJobSucceeded || b.Transition != codersdk.WorkspaceTransitionStart {
			return errNotYet(fmt.Sprintf("build %d: %s %s %s", b.BuildNumber, b.Transition, b.Job.Status, b.Job.Error))
		}
		built = time.Now()
		return nil
	})

	t.Run("without RBAC on pods the message names no pod", func(t *testing.T) {
		w := getWS(t, bname)
		c := meta.FindStatusCondition(w.Status.Conditions, aggv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.HasPrefix(c.Reason, "Agent") || strings.Contains(c.Message, "pod ") {
			t.Errorf("Ready as alice (no pod RBAC) = %+v; want False with an Agent reason and no pod", c)
		}
	})

	t.Run("a caller who may list pods sees the pod's image pull error within a minute", func(t *testing.T) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "alice-pods", Namespace: s.ns},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: []string{"get", "list"}}}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-pods", Namespace: s.ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice@example.com"}}}
		if err := s.c.Create(ctx, role); err != nil {
			t.Fatal(err)
		}
		if err := s.c.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
		var msg string
		testenv.WaitFor(t, time.Until(built.Add(time.Minute)), func() error {
			w := getWS(t, bname)
			c := meta.FindStatusCondition(w.Status.Conditions, aggv1.ConditionReady)
			if c == nil {
				return errNotYet("no Ready condition")
			}
			msg = c.Reason + ": " + c.Message
			if c.Status != metav1.ConditionFalse || !(strings.Contains(c.Message, "ErrImagePull") || strings.Contains(c.Message, "ImagePullBackOff")) {
				return errNotYet("Ready: " + msg)
			}
			return nil
		})
		t.Logf("%s after the build: %s", time.Since(built).Round(100*time.Millisecond), msg)
		if !strings.Contains(msg, "pod "+s.ns+"/") || !strings.Contains(msg, "container ") {
			t.Errorf("Ready message %q does not name the pod and its container", msg)
		}
	})

	t.Run("MCP diagnose_workspace shows the pod, its events and the build log", func(t *testing.T) {
		token := e2eMCPServiceAccountToken(t, s, "agent")
		e2eMCPGrant(t, s, "agent", s.ns,
			rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "coderworkspaces/log"}, Verbs: []string{"get", "list"}},
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: []string{"get", "list"}})
		s.op.WaitOK(t, s.op.MCP+"/readyz")
		agent := (&e2eMCPRecorder{}).connect(t, s.op.MCP, token)
		var d mcpserver.WorkspaceDiagnosis
		e2eMCPMust(t, agent.call(t, "diagnose_workspace", map[string]any{"namespace": s.ns, "name": bname}, &d))
		if d.Usable || !strings.HasPrefix(d.Summary, "Agent") || len(d.Pods) != 1 {
			t.Fatalf("diagnose_workspace: usable %v, summary %q, %d pods; want not usable, an Agent reason, the one pod\n%+v", d.Usable, d.Summary, len(d.Pods), d)
		}
		p := d.Pods[0]
		if !strings.Contains(strings.Join(p.Problems, " "), "ImagePullBackOff") && !strings.Contains(strings.Join(p.Problems, " "), "ErrImagePull") {
			t.Errorf("pod problems %q, want the image pull error", p.Problems)
		}
		var warning bool
		for _, e := range p.Events {
			warning = warning || (e.Type == "Warning" && strings.Contains(e.Message, badImage))
		}
		if !warning {
			t.Errorf("pod events %+v, want a Warning about pulling %s", p.Events, badImage)
		}
		if len(d.Workspace.Agents) != 1 || d.Workspace.Agents[0].Status == "connected" {
			t.Errorf("agents %+v, want one agent, not connected", d.Workspace.Agents)
		}
		t.Logf("diagnose_workspace: summary %q, notes %q, build log %d bytes", d.Summary, d.Notes, len(d.BuildLog))
	})
}
