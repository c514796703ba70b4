package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestIdentityMapped runs a control plane in Mapped mode against a real
// coderd holding an owner, a template admin, two members and a suspended
// user, and Kubernetes users authenticated by client certificates and a
// ServiceAccount token. Each sees and may do exactly what coderd lets
// their Coder user, which the test asks coderd itself with that user's
// own token.
func TestIdentityMapped(t *testing.T) {
	t.Parallel()
	env := newIdentityEnv(t)
	runSubtests(t, env, []subtest[*identityEnv]{
		{"each user lists what coderd shows them", testIdentityLists},
		{"a member's list costs coderd the member's own list", testIdentityListCost},
		{"template files only for those who may update the template", testIdentityTemplateFiles},
		{"reads and writes of others' workspaces are refused as coderd refuses them", testIdentityOthersRefused},
		{"writes are made as the caller", testIdentityWritesAsCaller},
		{"kubectl, a client-go informer and MCP see as the caller", testIdentityClients},
		{"unmapped, suspended and system users list nothing with a warning, get 404 and are refused writes naming why", testIdentityUnmapped},
		{"a watch shows the caller only what they may read", testIdentityWatch},
		{"one short-lived named token per user, replaced when revoked in coderd, revoked at shutdown", testIdentityTokens},
	})
}

// identityEnv is what TestIdentityMapped's subtests share.
type identityEnv struct {
	s *aggStack
	// ctx bounds the whole test.
	ctx context.Context
	// owner is coderd's first user's client; sessions has each Coder
	// user's client with a session of their own; tpl is the template of
	// every workspace.
	owner    *codersdk.Client
	sessions map[string]*codersdk.Client
	tpl      codersdk.Template
	// users has the clients of the Kubernetes users, by name.
	users map[string]dynamic.Interface
}

// newIdentityEnv builds the stack (with the proxy in front of coderd), the
// Coder users and their workspaces, the control plane in Mapped mode and
// the clients of the Kubernetes users.
func newIdentityEnv(t *testing.T) *identityEnv {
	s := newStack(t, withCoderdProxy(true), withCoder(testenv.CoderOptions{ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho}}))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	sessions, tpl := identityCoderUsers(t, ctx, s)
	identityMapped(t, ctx, s)
	users := identityKubeUsers(t, s)
	return &identityEnv{s: s, ctx: ctx, owner: s.coder.Client, sessions: sessions, tpl: tpl, users: users}
}

// identityCoderUsers makes the Coder users (tadmin a template admin,
// carol suspended), logs each in, and makes the workspaces a1 of alice, b1
// of bob and o1 of admin from echo template tpl.
func identityCoderUsers(t *testing.T, ctx context.Context, s *aggStack) (map[string]*codersdk.Client, codersdk.Template) {
	owner := s.coder.Client

	// Coder users, each with a session of their own to ask coderd what
	// it shows them.
	sessions := map[string]*codersdk.Client{"admin": owner}
	for _, u := range []string{"tadmin", "alice", "bob", "carol"} {
		if _, err := owner.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: u + "@example.com", Username: u, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
			UserLoginType: codersdk.LoginTypePassword,
		}); err != nil {
			t.Fatalf("create Coder user %s: %v", u, err)
		}
		login, err := owner.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: u + "@example.com", Password: "SomeSecurePassword!1"})
		if err != nil {
			t.Fatalf("log in as %s: %v", u, err)
		}
		sessions[u] = codersdk.New(s.coder.URL, codersdk.WithSessionToken(login.SessionToken))
	}
	if _, err := owner.UpdateUserRoles(ctx, "tadmin", codersdk.UpdateRoles{Roles: []string{codersdk.RoleTemplateAdmin}}); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.UpdateUserStatus(ctx, "carol", codersdk.UserStatusSuspended); err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.PushEchoTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	tpl := s.coderTemplate(t, "tpl")
	for owner, ws := range map[string]string{"alice": "a1", "bob": "b1", "admin": "o1"} {
		w, err := s.coder.Client.CreateUserWorkspace(ctx, owner, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: ws})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.coder.WaitBuild(ctx, w.LatestBuild.ID); err != nil {
			t.Fatal(err)
		}
	}
	return sessions, tpl
}

// identityMapped makes the Role for group devs and the deployer and other
// ServiceAccounts, and puts control plane coder in Mapped mode.
func identityMapped(t *testing.T, ctx context.Context, s *aggStack) {
	// Kubernetes: a Role for everyone in group devs and the deployer
	// ServiceAccount; Mapped mode with an OIDC-style prefix and one
	// explicit mapping.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "coder-user", Namespace: s.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "codertemplates"}, Verbs: []string{"*"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "coder-users", Namespace: s.ns},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "devs"},
			{Kind: rbacv1.ServiceAccountKind, Name: "deployer", Namespace: s.ns}, {Kind: rbacv1.ServiceAccountKind, Name: "other", Namespace: s.ns}}}
	for _, o := range []client.Object{role, binding,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer", Namespace: s.ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: s.ns}}} {
		if err := s.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	patch := `{"spec":{"identity":{"mode":"Mapped","usernamePrefix":"oidc:","matchBy":"Email","mappings":[{"kubernetesUser":"system:serviceaccount:` + s.ns + `:deployer","coderUser":"bob"}]}}}`
	ccp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "coder", Namespace: s.ns}}
	if err := s.c.Patch(ctx, ccp, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	waitIdentityMapped(t, ctx, s, ccp)
}

// waitIdentityMapped waits until the controller reports control plane
// ccp's identity, as its generation now has it, mapped.
func waitIdentityMapped(t *testing.T, ctx context.Context, s *aggStack, ccp *coderv1alpha1.CoderControlPlane) {
	t.Helper()
	testenv.WaitFor(t, time.Minute, func() error {
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(ccp), ccp); err != nil {
			return err
		}
		for _, c := range ccp.Status.Conditions {
			if c.Type == coderv1alpha1.ConditionIdentityMapped && c.Status == metav1.ConditionTrue && c.ObservedGeneration == ccp.Generation {
				return nil
			}
		}
		return fmt.Errorf("IdentityMapped is not True for generation %d: %+v", ccp.Generation, ccp.Status.Conditions)
	})
}

// identityKubeUsers is the clients of the Kubernetes users: by client
// certificate in group devs, and the deployer and other ServiceAccounts.
func identityKubeUsers(t *testing.T, s *aggStack) map[string]dynamic.Interface {
	users := map[string]dynamic.Interface{}
	for name, k8sUser := range map[string]string{"admin": "admin@example.com", "tadmin": "oidc:TAdmin@Example.com", "alice": "alice@example.com",
		"bob": "bob@example.com", "carol": "carol@example.com", "nobody": "nobody@example.com"} {
		cfg, err := s.k.UserConfig(k8sUser, "devs")
		if err != nil {
			t.Fatal(err)
		}
		users[name] = dynamicFor(t, cfg)
	}
	users["deployer"] = dynamicFor(t, serviceAccountConfig(t, s, "deployer"))
	users["other"] = dynamicFor(t, serviceAccountConfig(t, s, "other"))
	return users
}

// listNames lists resource res (coderworkspaces or codertemplates) of the
// stack's namespace as Kubernetes user who, and returns the names, sorted,
// and the list.
func (env *identityEnv) listNames(t *testing.T, who string, res string) ([]string, *unstructured.UnstructuredList) {
	t.Helper()
	s, ctx, users := env.s, env.ctx, env.users
	gvr := workspacesGVR
	if res == "codertemplates" {
		gvr = templatesGVR
	}
	l, err := users[who].Resource(gvr).Namespace(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("%s lists %s: %v", who, res, err)
	}
	var out []string
	for _, o := range l.Items {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return out, l
}

// coderWorkspaces is what coderd itself shows Coder user who, as object
// names.
func (env *identityEnv) coderWorkspaces(t *testing.T, who string) []string {
	t.Helper()
	ctx, sessions := env.ctx, env.sessions
	res, err := sessions[who].Workspaces(ctx, codersdk.WorkspaceFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range res.Workspaces {
		out = append(out, "coder."+w.OwnerName+"."+w.Name)
	}
	sort.Strings(out)
	return out
}

// testIdentityLists checks that each user lists what coderd shows them.
func testIdentityLists(t *testing.T, env *identityEnv) {
	listNames, coderWorkspaces := env.listNames, env.coderWorkspaces
	for who, coderUser := range map[string]string{"admin": "admin", "tadmin": "tadmin", "alice": "alice", "bob": "bob", "deployer": "bob"} {
		got, _ := listNames(t, who, "coderworkspaces")
		want := coderWorkspaces(t, coderUser)
		if !slices.Equal(got, want) {
			t.Errorf("%s (Coder user %s) lists workspaces %v; coderd shows that user %v", who, coderUser, got, want)
		}
	}
	if got, _ := listNames(t, "alice", "coderworkspaces"); !slices.Equal(got, []string{"coder.alice.a1"}) {
		t.Errorf("alice lists %v, want exactly her own workspace", got)
	}
}

// testIdentityListCost checks that a member's list costs coderd the member's own list, made with the member's token.
func testIdentityListCost(t *testing.T, env *identityEnv) {
	ctx, s, sessions, listNames := env.ctx, env.s, env.sessions, env.listNames
	listNames(t, "alice", "coderworkspaces") // maps alice, mints her token, asks coderd's authorization once
	before := s.proxy.Stats()
	start := time.Now()
	got, _ := listNames(t, "alice", "coderworkspaces")
	took := time.Since(start)
	cost := s.proxy.Stats().Since(before)
	if len(got) != 1 || len(cost) != 1 || cost["GET /api/v2/workspaces"].Requests != 1 {
		t.Errorf("alice's LIST (%v) cost coderd %+v, want exactly one GET /api/v2/workspaces", got, cost)
	}
	// Made with alice's token: coderd answered what it answers her
	// (her one workspace), not every workspace.
	before = s.proxy.Stats()
	own := codersdk.New(s.proxy.URL, codersdk.WithSessionToken(sessions["alice"].SessionToken()))
	if _, err := own.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatal(err)
	}
	ref := s.proxy.Stats().Since(before)["GET /api/v2/workspaces"].Bytes
	if b := cost["GET /api/v2/workspaces"].Bytes; b > ref+ref/10 {
		t.Errorf("coderd answered alice's LIST with %d bytes, her own list with %d: the LIST was not made as alice", b, ref)
	}
	t.Logf("alice's LIST took %s, coderd's list %s (%d bytes; her own list %d bytes)", took, cost["GET /api/v2/workspaces"].Time, cost["GET /api/v2/workspaces"].Bytes, ref)
}

// testIdentityTemplateFiles checks that template files are shown only to those who may update the template.
func testIdentityTemplateFiles(t *testing.T, env *identityEnv) {
	ctx, s, users, listNames := env.ctx, env.s, env.users, env.listNames
	for who, wantFiles := range map[string]bool{"alice": false, "bob": false, "tadmin": true, "admin": true} {
		_, l := listNames(t, who, "codertemplates")
		if len(l.Items) != 1 {
			t.Fatalf("%s lists %d templates, want 1", who, len(l.Items))
		}
		files, _, _ := unstructured.NestedMap(l.Items[0].Object, "spec", "files")
		if (len(files) > 0) != wantFiles {
			t.Errorf("%s sees %d files of the template, want files shown: %v", who, len(files), wantFiles)
		}
		got, err := users[who].Resource(templatesGVR).Namespace(s.ns).Get(ctx, "coder.tpl", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		files, _, _ = unstructured.NestedMap(got.Object, "spec", "files")
		if (len(files) > 0) != wantFiles {
			t.Errorf("%s gets %d files of the template, want files shown: %v", who, len(files), wantFiles)
		}
	}
}

// testIdentityOthersRefused checks that reads and writes of others' workspaces are refused as coderd refuses them.
func testIdentityOthersRefused(t *testing.T, env *identityEnv) {
	ctx, s, owner, users := env.ctx, env.s, env.owner, env.users
	ws := users["alice"].Resource(workspacesGVR).Namespace(s.ns)
	if _, err := ws.Get(ctx, "coder.bob.b1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("alice gets bob's workspace: %v, want NotFound", err)
	}
	if _, err := ws.Patch(ctx, "coder.bob.b1", types.MergePatchType, []byte(`{"spec":{"running":false}}`), metav1.PatchOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("alice patches bob's workspace: %v, want NotFound", err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": aggv1.SchemeGroupVersion.String(), "kind": "CoderWorkspace",
		"metadata": map[string]any{"name": "coder.bob.sneaky"}, "spec": map[string]any{"templateName": "tpl", "running": true}}}
	for _, dry := range [][]string{{metav1.DryRunAll}, nil} {
		_, err := ws.Create(ctx, obj, metav1.CreateOptions{DryRun: dry})
		if !apierrors.IsForbidden(err) {
			t.Errorf("alice creates a workspace for bob (dryRun %v): %v, want Forbidden", dry, err)
		}
	}
	if _, err := owner.WorkspaceByOwnerAndName(ctx, "bob", "sneaky", codersdk.WorkspaceOptions{}); err == nil {
		t.Errorf("coderd has a workspace sneaky for bob")
	}
	if err := users["alice"].Resource(templatesGVR).Namespace(s.ns).Delete(ctx, "coder.tpl", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice deletes the template: %v, want Forbidden", err)
	}
	// Kubernetes metadata alone needs what a change in Coder needs.
	_, err := users["alice"].Resource(templatesGVR).Namespace(s.ns).Patch(ctx, "coder.tpl", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"alice"}}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `Coder user "alice" may not update`) {
		t.Errorf("alice labels the template: %v, want Forbidden naming her Coder user", err)
	}
}

// testIdentityWritesAsCaller checks that writes are made as the caller.
func testIdentityWritesAsCaller(t *testing.T, env *identityEnv) {
	ctx, s, owner, users := env.ctx, env.s, env.owner, env.users
	ws := users["alice"].Resource(workspacesGVR).Namespace(s.ns)
	if _, err := ws.Patch(ctx, "coder.alice.a1", types.MergePatchType, []byte(`{"spec":{"running":false}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("alice stops her workspace: %v", err)
	}
	w, err := owner.WorkspaceByOwnerAndName(ctx, "alice", "a1", codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.LatestBuild.InitiatorUsername != "alice" || w.LatestBuild.Transition != codersdk.WorkspaceTransitionStop {
		t.Errorf("coderd's latest build of alice's workspace: %s by %q, want stop by alice", w.LatestBuild.Transition, w.LatestBuild.InitiatorUsername)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": aggv1.SchemeGroupVersion.String(), "kind": "CoderWorkspace",
		"metadata": map[string]any{"name": "coder.bob.b2"}, "spec": map[string]any{"templateName": "tpl", "running": true}}}
	if _, err := users["deployer"].Resource(workspacesGVR).Namespace(s.ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the deployer ServiceAccount (mapped to bob) creates a workspace for bob: %v", err)
	}
	w, err = owner.WorkspaceByOwnerAndName(ctx, "bob", "b2", codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.LatestBuild.InitiatorUsername != "bob" {
		t.Errorf("bob's new workspace was built by %q, want bob", w.LatestBuild.InitiatorUsername)
	}
}

// testIdentityClients checks that kubectl, a client-go informer and MCP see as the caller.
func testIdentityClients(t *testing.T, env *identityEnv) {
	ctx, s, users, coderWorkspaces := env.ctx, env.s, env.users, env.coderWorkspaces
	want := coderWorkspaces(t, "alice")
	r, err := s.kubectlAs(t, "alice@example.com", "devs", "").Run(ctx, "", "get", "cws", "-n", s.ns, "-o", "name")
	if err != nil {
		t.Fatalf("kubectl as alice: %v", err)
	}
	var got []string
	for _, l := range strings.Fields(r.Combined) {
		got = append(got, strings.TrimPrefix(l, "coderworkspace.aggregation.coder.com/"))
	}
	if !slices.Equal(got, want) {
		t.Errorf("kubectl get cws as alice: %v, want %v", got, want)
	}

	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(users["alice"], 0, s.ns, nil)
	inf := f.ForResource(workspacesGVR).Informer()
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		t.Fatal("alice's informer did not sync")
	}
	keys := inf.GetStore().ListKeys()
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = strings.TrimPrefix(k, s.ns+"/")
	}
	if !slices.Equal(keys, want) {
		t.Errorf("alice's informer holds %v, want %v", keys, want)
	}

	// The deployer ServiceAccount, mapped to bob, through MCP: the
	// tool lists with the agent's own token.
	rec := &e2eMCPRecorder{}
	agent := rec.connect(t, s.op.MCP, serviceAccountConfig(t, s, "deployer").BearerToken)
	var l mcpserver.WorkspaceList
	e2eMCPMust(t, agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns}, &l))
	var rows []string
	for _, r := range l.Items {
		rows = append(rows, r.Name)
	}
	sort.Strings(rows)
	if wantBob := coderWorkspaces(t, "bob"); !slices.Equal(rows, wantBob) {
		t.Errorf("list_workspaces as the deployer ServiceAccount (bob): %v, want %v", rows, wantBob)
	}
	res := agent.call(t, "set_workspace_running", map[string]any{"namespace": s.ns, "name": "coder.alice.a1", "running": false}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") {
		t.Errorf("set_workspace_running on alice's workspace as bob: isError %v %q, want not found", res.IsError, text)
	}
}

// testIdentityUnmapped checks that unmapped, suspended and system users list nothing with a warning, get 404 and are refused writes naming why.
func testIdentityUnmapped(t *testing.T, env *identityEnv) {
	ctx, s := env.ctx, env.s
	for who, want := range map[string]string{
		"nobody": `Kubernetes user "nobody@example.com" has no Coder user in control plane ` + s.ns + `/coder: no user's email is "nobody@example.com"`,
		"carol":  `Kubernetes user "carol@example.com" maps to Coder user "carol" in control plane ` + s.ns + `/coder, which is suspended`,
		"other":  `Kubernetes user "system:serviceaccount:` + s.ns + `:other" is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings)`,
	} {
		var cfg *rest.Config
		if who == "other" {
			cfg = serviceAccountConfig(t, s, "other")
		} else {
			var err error
			if cfg, err = s.k.UserConfig(map[string]string{"nobody": "nobody@example.com", "carol": "carol@example.com"}[who], "devs"); err != nil {
				t.Fatal(err)
			}
		}
		warned := &warningRecorder{}
		cfg.WarningHandler = warned
		d := dynamicFor(t, cfg)
		l, err := d.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 0 {
			t.Errorf("%s lists workspaces: %v, want none", who, err)
		}
		if got, wantWarn := warned.all(), want+": no coderworkspaces of control plane "+s.ns+"/coder are shown"; !slices.Contains(got, wantWarn) {
			t.Errorf("%s's list warnings %q, want %q", who, got, wantWarn)
		}
		_, err = d.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, "coder.alice.a1", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) || err.Error() != `coderworkspaces.aggregation.coder.com "coder.alice.a1" not found` {
			t.Errorf("%s gets a workspace: %v, want the plain 404", who, err)
		}
		_, err = d.Resource(workspacesGVR).Namespace(s.ns).Patch(ctx, "coder.alice.a1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s patches a workspace: %v, want 403 containing %q", who, err, want)
		}
	}
}

// testIdentityWatch checks that a watch shows the caller only what they may read.
func testIdentityWatch(t *testing.T, env *identityEnv) {
	ctx, s, owner, tpl, users := env.ctx, env.s, env.owner, env.tpl, env.users
	w, err := users["alice"].Resource(workspacesGVR).Namespace(s.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := owner.CreateUserWorkspace(ctx, "bob", codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "b3"}); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.CreateUserWorkspace(ctx, "alice", codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "a3"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch ended")
			}
			if ev.Type == watch.Error || ev.Type == watch.Bookmark {
				continue
			}
			name := ev.Object.(*unstructured.Unstructured).GetName()
			if !strings.HasPrefix(name, "coder.alice.") {
				t.Fatalf("alice's watch shows %s %s", ev.Type, name)
			}
			if name == "coder.alice.a3" {
				// An informer's LIST, from the watch cache the poller
				// keeps while the watch is open.
				l, err := users["alice"].Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range l.Items {
					if !strings.HasPrefix(o.GetName(), "coder.alice.") {
						t.Errorf("alice's LIST ?resourceVersion=0 shows %s", o.GetName())
					}
				}
				if len(l.Items) != 2 {
					t.Errorf("alice's LIST ?resourceVersion=0 shows %d workspaces, want her 2", len(l.Items))
				}
				return
			}
		case <-deadline:
			t.Fatal("alice's watch did not show her new workspace a3 within a minute")
		}
	}
}

// testIdentityTokens checks that each user has one short-lived named token, replaced when revoked in coderd and revoked at shutdown.
func testIdentityTokens(t *testing.T, env *identityEnv) {
	ctx, s, owner, users, listNames := env.ctx, env.s, env.owner, env.users, env.listNames
	mine := func() []codersdk.APIKeyWithOwner {
		keys, err := owner.Tokens(ctx, "alice", codersdk.TokensFilter{})
		if err != nil {
			t.Fatal(err)
		}
		var out []codersdk.APIKeyWithOwner
		for _, k := range keys {
			if strings.HasPrefix(k.TokenName, "coder-k8s_"+s.ns+"_coder_") {
				out = append(out, k)
			}
		}
		return out
	}
	keys := mine()
	if len(keys) != 1 || keys[0].LifetimeSeconds != 3600 {
		t.Fatalf("alice's coder-k8s tokens: %+v, want exactly one with a lifetime of 3600 s", keys)
	}
	if err := owner.DeleteAPIKey(ctx, "alice", keys[0].ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := listNames(t, "alice", "coderworkspaces"); len(got) == 0 {
		t.Errorf("alice lists nothing after her token was revoked")
	}
	if _, err := users["alice"].Resource(workspacesGVR).Namespace(s.ns).Patch(ctx, "coder.alice.a1", types.MergePatchType, []byte(`{"spec":{"running":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("alice starts her workspace with a revoked token in the cache: %v", err)
	}
	after := mine()
	if len(after) != 1 || after[0].ID == keys[0].ID {
		t.Fatalf("alice's coder-k8s tokens after the revocation: %+v, want one new token", after)
	}
	if code := s.op.Terminate(t, 30*time.Second); code != 0 {
		t.Fatalf("operator exited with %d after SIGTERM; log tail:\n%s", code, s.op.LogTail(40))
	}
	if left := mine(); len(left) != 0 {
		t.Errorf("alice still has coder-k8s tokens after the operator stopped: %+v; log tail:\n%s", left, s.op.LogTail(40))
	}
}

// warningRecorder keeps the Warning headers a client received.
type warningRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.seen...)
}

func dynamicFor(t *testing.T, cfg *rest.Config) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// serviceAccountConfig authenticates as a ServiceAccount of the stack's
// namespace with a token from the TokenRequest API.
func serviceAccountConfig(t *testing.T, s *aggStack, name string) *rest.Config {
	t.Helper()
	cfg := rest.AnonymousClientConfig(s.k.Config)
	cfg.BearerToken = serviceAccountToken(t, s, s.ns, name)
	return cfg
}
