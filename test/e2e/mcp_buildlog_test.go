package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// testMCPBuildLogs checks get_workspace_build_log and
// get_template_version_log as the agent ServiceAccount (mapped to the
// first user, an owner) against coderd's logs endpoints: the whole log,
// tailLines, a build by number, the byte cap; errors as isError results
// (a workspace that does not exist, a bad tailLines, no RBAC for the
// subresource); and as a ServiceAccount mapped to a Coder member: their
// own workspace's log, and another user's refused as not found.
func testMCPBuildLogs(t *testing.T, env *mcpEnv) {
	ctx, s, agent := context.Background(), env.s, env.agent
	ws := s.coderWorkspace(t, "ws-run")
	b := ws.LatestBuild
	want := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+b.ID.String()+"/logs"), b.Job, false)
	args := map[string]any{"namespace": s.ns, "name": s.workspaceName("ws-run"), "tailLines": 5000}
	var got mcpserver.JobLog
	e2eMCPMust(t, agent.call(t, "get_workspace_build_log", args, &got))
	if got.Log != want || got.Truncated || got.TailLines != 5000 || got.LimitBytes != 16384 {
		t.Errorf("get_workspace_build_log: %+v\nwant the log:\n%s", got, want)
	}
	lines := strings.SplitAfter(want, "\n")
	lines = lines[:len(lines)-1]
	args["tailLines"], args["build"] = 3, b.BuildNumber
	e2eMCPMust(t, agent.call(t, "get_workspace_build_log", args, &got))
	if w := strings.Join(lines[len(lines)-3:], ""); got.Log != w {
		t.Errorf("tailLines 3, build %d: %q, want %q", b.BuildNumber, got.Log, w)
	}
	delete(args, "build")
	args["tailLines"], args["limitBytes"] = 5000, 40
	e2eMCPMust(t, agent.call(t, "get_workspace_build_log", args, &got))
	if !got.Truncated || got.Log != want[:40] {
		t.Errorf("limitBytes 40: truncated %v, %q; want %q cut", got.Truncated, got.Log, want[:40])
	}

	tpl := s.coderTemplate(t, "base")
	v, err := s.coder.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
	if err != nil {
		t.Fatal(err)
	}
	wantImport := renderJobLog(s.jobLogEntries(t, "/api/v2/templateversions/"+v.ID.String()+"/logs"), v.Job, false)
	e2eMCPMust(t, agent.call(t, "get_template_version_log", map[string]any{"namespace": s.ns, "name": s.org + ".base." + v.Name, "tailLines": 5000}, &got))
	if got.Log != wantImport || !strings.Contains(got.Log, "==> ⧗ ") {
		t.Errorf("get_template_version_log: %q, want %q", got.Log, wantImport)
	}

	nobody := env.rec.connect(t, s.op.MCP, env.nobodyToken)
	for _, c := range []struct {
		name  string
		agent *e2eMCPAgent
		tool  string
		args  map[string]any
		want  string
	}{
		{"a workspace that does not exist", agent, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.workspaceName("nope")}, "not found"},
		{"a build that does not exist", agent, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.workspaceName("ws-run"), "build": 999}, "not found"},
		{"a negative tailLines", agent, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.workspaceName("ws-run"), "tailLines": -1}, "tailLines must be positive"},
		{"a version that does not exist", agent, "get_template_version_log", map[string]any{"namespace": s.ns, "name": s.org + ".base.nope"}, "not found"},
		{"no RBAC for the log", nobody, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.workspaceName("ws-run")}, "forbidden"},
	} {
		res := c.agent.call(t, c.tool, c.args, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, c.want) {
			t.Errorf("%s: isError %v %.300q, want an error with %q", c.name, res.IsError, text, c.want)
		}
	}

	t.Run("as a ServiceAccount mapped to a Coder member", func(t *testing.T) {
		const sa, member = "log-member", "logmember"
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{Email: member + "@example.com", Username: member,
			UserLoginType: codersdk.LoginTypeNone, OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
			t.Fatal(err)
		}
		own, err := s.coder.Client.CreateUserWorkspace(ctx, member, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "mine"})
		if err != nil {
			t.Fatal(err)
		}
		ob, err := s.coder.WaitBuild(ctx, own.LatestBuild.ID)
		if err != nil {
			t.Fatal(err)
		}
		var ccp coderv1alpha1.CoderControlPlane
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
			t.Fatal(err)
		}
		ccp.Spec.Identity.Mappings = append(ccp.Spec.Identity.Mappings, coderv1alpha1.IdentityMapping{
			KubernetesUser: "system:serviceaccount:" + e2eMCPAgentNamespace + ":" + sa, CoderUser: member})
		if err := s.c.Update(ctx, &ccp); err != nil {
			t.Fatal(err)
		}
		token := e2eMCPServiceAccountToken(t, s, sa)
		e2eMCPGrant(t, s, sa, s.ns, rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName},
			Resources: []string{"coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}})
		memberAgent := env.rec.connect(t, s.op.MCP, token)
		wantOwn := renderJobLog(s.jobLogEntries(t, "/api/v2/workspacebuilds/"+ob.ID.String()+"/logs"), ob.Job, false)
		testenv.WaitFor(t, 30*time.Second, func() error {
			res := memberAgent.call(t, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.org + "." + member + ".mine", "tailLines": 5000}, &got)
			if res.IsError {
				return errNotYet(fmt.Sprintf("the member's own log: %s", e2eMCPText(res)))
			}
			if got.Log != wantOwn {
				return fmt.Errorf("the member's own log %q, want %q", got.Log, wantOwn)
			}
			return nil
		})
		res := memberAgent.call(t, "get_workspace_build_log", map[string]any{"namespace": s.ns, "name": s.workspaceName("ws-run")}, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") {
			t.Errorf("another user's log as the member: isError %v %.300q, want not found", res.IsError, text)
		}
		e2eMCPMust(t, memberAgent.call(t, "get_template_version_log", map[string]any{"namespace": s.ns, "name": s.org + ".base." + v.Name, "tailLines": 5000}, &got))
		if got.Log != wantImport {
			t.Errorf("the import log as the member: %q, want %q", got.Log, wantImport)
		}
	})
}
