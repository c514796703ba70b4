package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// testMCPUsers checks whoami and list_users as the agent, mapped to the
// stack coderd's first user (an owner), against coderd, and as a
// ServiceAccount no mapping names: whoami is an isError result saying why,
// list_users an empty page.
func testMCPUsers(t *testing.T, env *mcpEnv) {
	ctx, s, agent := context.Background(), env.s, env.agent
	first, err := s.coder.Client.User(ctx, codersdk.Me)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{Email: "mcp-robot@example.com", Username: "mcp-robot",
		Name: "MCP Robot", UserLoginType: codersdk.LoginTypeNone, OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
		t.Fatal(err)
	}

	var me mcpserver.WhoAmI
	e2eMCPMust(t, agent.call(t, "whoami", nil, &me))
	if me.KubernetesUser != "system:serviceaccount:agents:agent" || len(me.Coder) != 1 {
		t.Fatalf("whoami: %+v; want the agent's ServiceAccount and one control plane", me)
	}
	id := me.Coder[0]
	if id.Namespace != s.ns || id.Username != first.Username || id.Email != first.Email || id.Status != string(first.Status) ||
		!slices.Contains(id.Roles, "owner") || len(id.Organizations) != 1 || id.Error != "" {
		t.Errorf("whoami's Coder user %+v; want %s (%s, %s, owner) in namespace %s", id, first.Username, first.Email, first.Status, s.ns)
	}
	var inNS mcpserver.WhoAmI
	e2eMCPMust(t, agent.call(t, "whoami", map[string]any{"namespace": s.ns}, &inNS))
	if len(inNS.Coder) != 1 || inNS.Coder[0].Username != first.Username {
		t.Errorf("whoami in namespace %s: %+v", s.ns, inNS)
	}

	// The user just made in Coder shows within the watch cache's age.
	var all mcpserver.UserList
	testenv.WaitFor(t, 30*time.Second, func() error {
		e2eMCPMust(t, agent.call(t, "list_users", map[string]any{"namespace": s.ns}, &all))
		if !slices.ContainsFunc(all.Items, func(r mcpserver.UserRow) bool { return r.Name == "mcp-robot" }) {
			return errNotYet("list_users does not show mcp-robot yet")
		}
		return nil
	})
	coderUsers, err := s.coder.Client.Users(ctx, codersdk.UsersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != len(coderUsers.Users) {
		t.Errorf("list_users: %d rows, coderd has %d users", len(all.Items), len(coderUsers.Users))
	}
	for _, r := range all.Items {
		i := slices.IndexFunc(coderUsers.Users, func(u codersdk.User) bool { return u.Username == r.Name })
		if i < 0 {
			t.Errorf("list_users row %+v: no such user in coderd", r)
			continue
		}
		u := coderUsers.Users[i]
		if r.Email != u.Email || r.Status != string(u.Status) || r.FullName != u.Name {
			t.Errorf("list_users row %+v; coderd: %s %s %q", r, u.Email, u.Status, u.Name)
		}
	}
	for _, c := range []struct {
		args map[string]any
		want []string
	}{
		{map[string]any{"search": "MCP-ROB"}, []string{"mcp-robot"}},
		{map[string]any{"search": "robot@example"}, []string{"mcp-robot"}},
		{map[string]any{"role": "owner", "search": first.Username}, []string{first.Username}},
		{map[string]any{"role": "auditor", "search": "mcp-robot"}, nil},
		{map[string]any{"status": "suspended"}, nil},
	} {
		c.args["namespace"] = s.ns
		var l mcpserver.UserList
		e2eMCPMust(t, agent.call(t, "list_users", c.args, &l))
		var names []string
		for _, r := range l.Items {
			names = append(names, r.Name)
		}
		if !slices.Equal(names, c.want) {
			t.Errorf("list_users %v: %v, want %v", c.args, names, c.want)
		}
	}
	var page mcpserver.UserList
	e2eMCPMust(t, agent.call(t, "list_users", map[string]any{"namespace": s.ns, "limit": 1}, &page))
	if len(page.Items) != 1 || page.Continue == "" {
		t.Errorf("list_users limit 1: %d rows, continue %q", len(page.Items), page.Continue)
	}
	if res := agent.call(t, "list_users", map[string]any{"namespace": s.ns, "status": "gone"}, nil); !res.IsError || !strings.Contains(e2eMCPText(res), "active, dormant, suspended") {
		t.Errorf("list_users with an unknown status: isError %v %q", res.IsError, e2eMCPText(res))
	}

	// A ServiceAccount no mapping names: RBAC lets it read coderusers,
	// but it has no Coder user.
	token := e2eMCPServiceAccountToken(t, s, "stranger")
	e2eMCPGrant(t, s, "stranger", "", []rbacv1.PolicyRule{
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderusers"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
	}...)
	stranger := env.rec.connect(t, s.op.MCP, token)
	res := stranger.call(t, "whoami", nil, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, `"system:serviceaccount:agents:stranger" maps to no Coder user`) ||
		!strings.Contains(text, "only through an explicit mapping") {
		t.Errorf("whoami as an unmapped ServiceAccount: isError %v %q; want an error saying it maps to no Coder user and why", res.IsError, text)
	}
	res = stranger.call(t, "whoami", map[string]any{"namespace": s.ns}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "only through an explicit mapping") {
		t.Errorf("whoami in %s as an unmapped ServiceAccount: isError %v %q", s.ns, res.IsError, text)
	}
	var none mcpserver.UserList
	e2eMCPMust(t, stranger.call(t, "list_users", map[string]any{"namespace": s.ns}, &none))
	if len(none.Items) != 0 {
		t.Errorf("list_users as an unmapped ServiceAccount: %d rows, want none", len(none.Items))
	}
	// The nobody ServiceAccount may read no coderusers: kube-apiserver's
	// refusal, not a Coder one.
	nobody := env.rec.connect(t, s.op.MCP, env.nobodyToken)
	if res := nobody.call(t, "list_users", map[string]any{"namespace": s.ns}, nil); !res.IsError || !strings.Contains(e2eMCPText(res), `cannot list resource "coderusers"`) {
		t.Errorf("list_users without RBAC: isError %v %q", res.IsError, e2eMCPText(res))
	}
}
