package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The operator's settings in TestOperatorTokenRotation: a check every few
// seconds and a grace period that still exceeds every request's time to
// coderd (rotRequestTimeout), as the documentation asks.
const (
	rotCheckInterval  = 3 * time.Second
	rotRevokeDelay    = 10 * time.Second
	rotRequestTimeout = 5 * time.Second
)

// TestOperatorTokenRotation rotates the operator token of control plane
// coder/coder, the way the controller does when a third of its lifetime
// is left, while two mapped users (alice and bob, Coder members) each keep
// a watch open and LIST their workspaces every second through
// kube-apiserver. The controller revokes the replaced token after its
// grace period. Neither user sees a failed request or a watch ending, and
// coderd refuses none of coder-k8s's calls; the replaced token no longer
// works in coderd afterwards, and a workspace created after the
// revocation reaches its owner's watch (the poller uses the new token).
func TestOperatorTokenRotation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd, PostgreSQL and coderd from bin/ (make tools)")
	}
	start := time.Now()
	s := newStack(t, withCoderdProxy(true),
		withCoder(testenv.CoderOptions{ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho}}),
		withOperator(OperatorOptions{
			Aggregated: fmt.Sprintf("coder: {requestTimeout: %s}", rotRequestTimeout),
			Controller: []string{
				"operatorAccessCheckInterval: " + rotCheckInterval.String(),
				"replacedTokenRevocationDelay: " + rotRevokeDelay.String(),
			},
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	users := rotationUsers(t, ctx, s)
	t.Logf("stack and users ready after %s", time.Since(start).Round(time.Millisecond))

	// Continuous use: a watch and a LIST a second per user, from now
	// until the end of the test.
	load := &rotationLoad{}
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for who, dyn := range users {
		load.run(t, loadCtx, &wg, who, dyn.Resource(workspacesGVR).Namespace(s.ns))
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopLoad()
			wg.Wait()
		}
	}
	defer stop()
	proxyFrom := time.Now()
	time.Sleep(3 * time.Second) // some requests with the first token

	// The rotation: the token Secret says the token is close to expiry,
	// which the controller's next pass acts on.
	var ccp coderv1alpha1.CoderControlPlane
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
		t.Fatal(err)
	}
	oldToken := operatorToken(t, s, &ccp)
	secretName := ccp.Status.OperatorTokenSecretRef.Name
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"coder.com/token-expires-at":%q}}}`, time.Now().Add(time.Minute).UTC().Format(time.RFC3339))
	secret := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: secretName}}
	if err := s.c.Patch(ctx, secret, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	rotationStart := time.Now()
	var newToken string
	testenv.WaitFor(t, rotCheckInterval+15*time.Second, func() error {
		if newToken = secretValue(t, s, s.ns, secretName, coderapi.TokenKey); newToken == oldToken {
			return errNotYet("the operator token Secret still holds the first token")
		}
		return nil
	})
	rotatedAt := time.Now()
	old := codersdk.New(s.coder.URL, codersdk.WithSessionToken(oldToken))
	if _, err := old.User(ctx, codersdk.Me); err != nil {
		t.Errorf("the replaced token stopped working in coderd as soon as it was replaced (%v): readers still using it fail", err)
	}
	testenv.WaitFor(t, rotRevokeDelay+rotCheckInterval+15*time.Second, func() error {
		if _, err := old.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			return errNotYet(fmt.Sprintf("coderd still takes the replaced token (%v)", err))
		}
		return nil
	})
	revokedAt := time.Now()
	t.Logf("rotated %s after the Secret said the token was near expiry; the replaced token was revoked %s after the rotation",
		rotatedAt.Sub(rotationStart).Round(time.Millisecond), revokedAt.Sub(rotatedAt).Round(time.Millisecond))
	if d := revokedAt.Sub(rotatedAt); d < rotRevokeDelay-time.Second {
		t.Errorf("the replaced token was revoked %s after the rotation, before the %s grace period", d, rotRevokeDelay)
	}
	fresh := codersdk.New(s.coder.URL, codersdk.WithSessionToken(newToken))
	if _, err := fresh.User(ctx, codersdk.Me); err != nil {
		t.Errorf("the new operator token in coderd: %v", err)
	}

	// Use goes on after the revocation (polls and LISTs with the new
	// token only), and a change made now reaches its owner's watch.
	time.Sleep(3 * time.Second)
	tpl := s.coderTemplate(t, "tpl")
	w, err := s.coder.Client.CreateUserWorkspace(ctx, "alice", codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: "a2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.WaitBuild(ctx, w.LatestBuild.ID); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		if !slices.Contains(load.added("alice"), "coder.alice.a2") {
			return errNotYet(fmt.Sprintf("alice's watch has not shown coder.alice.a2 (added: %v)", load.added("alice")))
		}
		return nil
	})
	stop()

	lists, watches, failures := load.report()
	t.Logf("%d LISTs and %d watches by alice and bob over %s; failures: %d", lists, watches, time.Since(proxyFrom).Round(time.Millisecond), len(failures))
	for _, f := range failures {
		t.Errorf("a request failed during the rotation: %s", f)
	}
	if min := int(time.Since(proxyFrom)/time.Second) / 2; lists < 2*min {
		t.Errorf("only %d LISTs were made, want at least %d: the load did not run", lists, 2*min)
	}
	if added := load.added("bob"); slices.Contains(added, "coder.alice.a2") {
		t.Errorf("bob's watch showed alice's workspace: %v", added)
	}
	var refused []string
	for _, r := range s.proxy.Recent() {
		if !r.Start.Before(proxyFrom) && r.Status == http.StatusUnauthorized {
			refused = append(refused, fmt.Sprintf("%s at %s", r.Endpoint, r.Start.Format("15:04:05.000")))
		}
	}
	if len(refused) > 0 {
		t.Errorf("coderd answered 401 to %d of coder-k8s's calls during the rotation: %v", len(refused), refused)
	}
	cfExpectEvent(t, s, s.ns, "OperatorTokenRotated")
	cfExpectEvent(t, s, s.ns, "OperatorTokenRevoked")
	t.Logf("TestOperatorTokenRotation took %s", time.Since(start).Round(time.Millisecond))
}

// rotationUsers makes Coder members alice and bob with workspaces a1 and
// b1 (template tpl, echo), lets Kubernetes users alice@example.com and
// bob@example.com read coderworkspaces in the stack's namespace (mapped
// by email, the stack's default), and returns their clients once each
// lists their own workspace.
func rotationUsers(t *testing.T, ctx context.Context, s *aggStack) map[string]dynamic.Interface {
	t.Helper()
	if _, err := s.coder.PushEchoTemplate(ctx, "tpl"); err != nil {
		t.Fatal(err)
	}
	tpl := s.coderTemplate(t, "tpl")
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "workspace-reader", Namespace: s.ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "workspace-readers", Namespace: s.ns},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}
	users := map[string]dynamic.Interface{}
	for who, ws := range map[string]string{"alice": "a1", "bob": "b1"} {
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: who + "@example.com", Username: who, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
			UserLoginType: codersdk.LoginTypePassword,
		}); err != nil {
			t.Fatalf("create Coder user %s: %v", who, err)
		}
		w, err := s.coder.Client.CreateUserWorkspace(ctx, who, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: ws})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.coder.WaitBuild(ctx, w.LatestBuild.ID); err != nil {
			t.Fatal(err)
		}
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: who + "@example.com"})
		cfg, err := s.k.UserConfig(who + "@example.com")
		if err != nil {
			t.Fatal(err)
		}
		users[who] = dynamicFor(t, cfg)
	}
	for _, o := range []client.Object{role, binding} {
		if err := s.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for who, dyn := range users {
		want := map[string]string{"alice": "coder.alice.a1", "bob": "coder.bob.b1"}[who]
		testenv.WaitFor(t, time.Minute, func() error {
			list, err := dyn.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if len(list.Items) != 1 || list.Items[0].GetName() != want {
				return errNotYet(fmt.Sprintf("%s lists %d workspaces, want only %s", who, len(list.Items), want))
			}
			return nil
		})
	}
	return users
}

// rotationLoad is the users' continuous use and what it observed.
type rotationLoad struct {
	mu             sync.Mutex
	lists, watches int
	failures       []string
	addedBy        map[string][]string
}

// run starts, in wg, user who's watch of res and a LIST of res every
// second, both until ctx ends. A failed LIST, a watch that cannot start,
// an error event or a watch that ends before ctx are failures.
func (l *rotationLoad) run(t *testing.T, ctx context.Context, wg *sync.WaitGroup, who string, res dynamic.ResourceInterface) {
	t.Helper()
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("%s's first LIST: %v", who, err)
	}
	w, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatalf("%s's watch: %v", who, err)
	}
	l.record(func() { l.watches++ })
	wg.Go(func() {
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				switch {
				case !ok:
					if ctx.Err() == nil {
						l.fail("%s's watch ended at %s", who, time.Now().Format("15:04:05.000"))
					}
					return
				case ev.Type == watch.Error:
					l.fail("%s's watch sent an error at %s: %v", who, time.Now().Format("15:04:05.000"), ev.Object)
				case ev.Type == watch.Added:
					if o, ok := ev.Object.(metav1.Object); ok {
						l.record(func() {
							if l.addedBy == nil {
								l.addedBy = map[string][]string{}
							}
							l.addedBy[who] = append(l.addedBy[who], o.GetName())
						})
					}
				}
			}
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			at := time.Now()
			_, err := res.List(ctx, metav1.ListOptions{})
			if ctx.Err() != nil {
				return
			}
			l.record(func() { l.lists++ })
			if err != nil {
				l.fail("%s's LIST at %s: %v", who, at.Format("15:04:05.000"), err)
			}
		}
	})
}

func (l *rotationLoad) record(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f()
}

func (l *rotationLoad) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.record(func() { l.failures = append(l.failures, msg) })
}

// added is the names user who's watch showed added so far.
func (l *rotationLoad) added(who string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.addedBy[who])
}

func (l *rotationLoad) report() (lists, watches int, failures []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lists, l.watches, slices.Clone(l.failures)
}
