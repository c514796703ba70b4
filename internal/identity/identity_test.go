package identity

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// coderd is a real coderd with an owner (admin), two members (alice, bob),
// a suspended user (carol) and a user named as coder-k8s's operator user
// (coder-k8s), reached by the operator's client.
type coderd struct {
	c     *testenv.Coder
	owner *codersdk.Client
	cd    Coderd
}

func newCoderd(t testing.TB, rules Rules) *coderd {
	t.Helper()
	c := testenv.NewCoder(t, testenv.CoderOptions{})
	ctx := t.Context()
	for _, u := range []string{"alice", "bob", "carol", "coder-k8s"} {
		if _, err := c.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: u + "@example.com", Username: u, Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{c.OrganizationID}, UserLoginType: codersdk.LoginTypePassword,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.UpdateUserStatus(ctx, "carol", codersdk.UserStatusSuspended); err != nil {
		t.Fatal(err)
	}
	owner := coderapi.NewClient(c.URL, c.SessionToken, 0, coderapi.Target{})
	return &coderd{c: c, owner: owner, cd: Coderd{Key: "ns/cp " + c.URL.String(), Name: "control plane ns/cp", Tag: "ns_cp", Owner: owner, Rules: rules}}
}

func k8sUser(name string) user.Info { return &user.DefaultInfo{Name: name} }

func TestMapping(t *testing.T) {
	d := newCoderd(t, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	mappings := []Mapping{
		{KubernetesUser: "system:serviceaccount:argocd:argocd-application-controller", CoderUser: "bob"},
		{KubernetesUser: "ci-bot", CoderUser: "alice@example.com"},
	}
	cases := []struct {
		name    string
		rules   Rules
		user    string
		want    string // Coder username, or "" for a refusal
		refused string
	}{
		{"email", Rules{MatchField: MatchEmail}, "alice@example.com", "alice", ""},
		{"email ignoring case", Rules{MatchField: MatchEmail}, "ALICE@Example.COM", "alice", ""},
		{"prefix stripped", Rules{UsernamePrefix: "oidc:", MatchField: MatchEmail}, "oidc:bob@example.com", "bob", ""},
		{"username", Rules{MatchField: MatchUsername}, "Alice", "alice", ""},
		{"explicit ServiceAccount", Rules{MatchField: MatchEmail, Mappings: mappings}, "system:serviceaccount:argocd:argocd-application-controller", "bob", ""},
		{"explicit to an email", Rules{MatchField: MatchUsername, Mappings: mappings}, "ci-bot", "alice", ""},
		{"a substring is no match", Rules{MatchField: MatchEmail}, "ice@example.com", "",
			`Kubernetes user "ice@example.com" has no Coder user in control plane ns/cp: no user's email is "ice@example.com"`},
		{"no user", Rules{MatchField: MatchUsername}, "nobody", "",
			`Kubernetes user "nobody" has no Coder user in control plane ns/cp: no user's username is "nobody"`},
		{"suspended", Rules{MatchField: MatchEmail}, "carol@example.com", "",
			`Kubernetes user "carol@example.com" maps to Coder user "carol" in control plane ns/cp, which is suspended`},
		{"system user not mapped", Rules{MatchField: MatchEmail, Mappings: mappings}, "system:serviceaccount:default:default", "",
			`Kubernetes user "system:serviceaccount:default:default" is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings)`},
		{"explicit mapping to nobody", Rules{MatchField: MatchEmail, Mappings: []Mapping{{KubernetesUser: "x", CoderUser: "ghost"}}}, "x", "",
			`Kubernetes user "x" (mapped explicitly to "ghost") has no Coder user in control plane ns/cp: no user's username is "ghost"`},
		{"no user at all", Rules{MatchField: MatchEmail}, "", "", "the request has no authenticated user"},
		{"not an email", Rules{MatchField: MatchEmail}, "https://issuer.example.com#1234", "",
			`Kubernetes user "https://issuer.example.com#1234" has no Coder user in control plane ns/cp: no user's email is "https://issuer.example.com#1234"`},
		{"no query coderd accepts", Rules{MatchField: MatchEmail}, "oidc:alice@example.com", "",
			`Kubernetes user "oidc:alice@example.com" has no Coder user in control plane ns/cp: no user's email is "oidc:alice@example.com"`},
		{"the operator user", Rules{MatchField: MatchUsername}, "coder-k8s", "",
			`Kubernetes user "coder-k8s" maps to Coder user "coder-k8s" in control plane ns/cp, which coder-k8s uses for itself: map it to a Coder user of its own`},
		{"the first user by email", Rules{MatchField: MatchEmail}, "Admin@example.com", "",
			`Kubernetes user "Admin@example.com" maps to Coder user "admin" in control plane ns/cp, which coder-k8s uses for itself: map it to a Coder user of its own`},
		{"the first user explicitly", Rules{MatchField: MatchEmail, Mappings: []Mapping{{KubernetesUser: "system:serviceaccount:ci:deployer", CoderUser: "ADMIN"}}}, "system:serviceaccount:ci:deployer", "",
			`Kubernetes user "system:serviceaccount:ci:deployer" (mapped explicitly to "ADMIN") maps to Coder user "admin" in control plane ns/cp, which coder-k8s uses for itself: map it to a Coder user of its own`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New(testr.New(t), Options{})
			cd := d.cd
			tc.rules.Mode = ModeMapped
			cd.Rules = tc.rules
			// As a control plane whose coderd coder-k8s set up: its
			// operator user and the first user it created.
			cd.Reserved = []string{"coder-k8s", "Admin"}
			cd.Key += " " + tc.name // no answers shared between cases
			c, err := s.Caller(t.Context(), cd, k8sUser(tc.user))
			if tc.want == "" {
				if !IsRefused(err) || err.Error() != tc.refused {
					t.Fatalf("got %v, want the refusal %q", err, tc.refused)
				}
				if s.Minted() != 0 {
					t.Errorf("a refused caller minted %d tokens", s.Minted())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Username != tc.want {
				t.Fatalf("mapped to %q, want %q", c.Username, tc.want)
			}
			me, err := c.Client.User(t.Context(), codersdk.Me)
			if err != nil {
				t.Fatal(err)
			}
			if me.Username != tc.want {
				t.Errorf("the caller's client acts as %q, want %q", me.Username, tc.want)
			}
		})
	}
	// On the same coderd, to start one fewer.
	t.Run("reserved after mapping", func(t *testing.T) { testReservedAfterMapping(t, d) })
	t.Run("cluster controllers", func(t *testing.T) { testClusterControllers(t, d) })
	t.Run("created after a refusal", func(t *testing.T) { testCreatedAfterRefusal(t, d) })
}

// A Coder user created just after a read refused their Kubernetes user
// (a garbage collector's list, in a cluster where it shares kubectl's
// user) may write at once: a write does not trust the remembered
// refusal, while reads keep it for refusedTTL.
func testCreatedAfterRefusal(t *testing.T, d *coderd) {
	ctx := t.Context()
	s := New(testr.New(t), Options{})
	cd := d.cd
	cd.Rules = Rules{Mode: ModeMapped, MatchField: MatchUsername, Mappings: []Mapping{{KubernetesUser: "admin", CoderUser: "ops"}}}
	want := `Kubernetes user "admin" (mapped explicitly to "ops") has no Coder user in control plane ns/cp: no user's username is "ops"`
	if _, err := s.Caller(ctx, cd, k8sUser("admin")); !IsRefused(err) || err.Error() != want {
		t.Fatalf("before ops exists: %v, want the refusal %q", err, want)
	}
	if _, err := d.c.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: "ops@example.com", Username: "ops", Password: "SomeSecurePassword!1",
		OrganizationIDs: []uuid.UUID{d.c.OrganizationID}, UserLoginType: codersdk.LoginTypePassword,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Caller(ctx, cd, k8sUser("admin")); !IsRefused(err) || err.Error() != want {
		t.Errorf("a read within %s of the refusal: %v, want the remembered refusal %q", refusedTTL, err, want)
	}
	c, err := s.CallerToWrite(ctx, cd, k8sUser("admin"))
	if err != nil || c.Username != "ops" {
		t.Fatalf("a write once ops exists: %+v, %v; want Coder user ops", c, err)
	}
	// The write's lookup is remembered for reads too.
	if c, err := s.Caller(ctx, cd, k8sUser("admin")); err != nil || c.Username != "ops" {
		t.Errorf("a read after the write: %+v, %v; want Coder user ops", c, err)
	}
}

// A Coder user that becomes reserved after it was mapped (the first
// user's Secret appeared) is refused at once, not when the mapping is
// looked up again.
func testReservedAfterMapping(t *testing.T, d *coderd) {
	s := New(testr.New(t), Options{})
	c, err := s.Caller(t.Context(), d.cd, k8sUser("admin@example.com"))
	if err != nil || c.Username != "admin" {
		t.Fatalf("before admin is reserved: %+v, %v", c, err)
	}
	cd := d.cd
	cd.Reserved = []string{"coder-k8s", "admin"}
	_, err = s.Caller(t.Context(), cd, k8sUser("admin@example.com"))
	want := `Kubernetes user "admin@example.com" maps to Coder user "admin" in control plane ns/cp, which coder-k8s uses for itself: map it to a Coder user of its own`
	if !IsRefused(err) || err.Error() != want {
		t.Fatalf("once admin is reserved: %v, want the refusal %q", err, want)
	}
	if c, err := s.Caller(t.Context(), cd, k8sUser("alice@example.com")); err != nil || c.Username != "alice" {
		t.Errorf("alice, not reserved: %+v, %v", c, err)
	}
}

// The cluster's controllers act with the operator's session in Mapped
// mode, without a Coder user, a lookup or a token; everyone else is
// mapped as before.
func testClusterControllers(t *testing.T, d *coderd) {
	ctx := t.Context()
	const gc = "system:serviceaccount:kube-system:generic-garbage-collector"
	s := New(testr.New(t), Options{ClusterControllers: []string{gc, "system:kube-controller-manager"}})

	c, err := s.Caller(ctx, d.cd, k8sUser(gc))
	if err != nil {
		t.Fatal(err)
	}
	if !c.ClusterController || c.Client != d.cd.Owner || c.UserID != uuid.Nil || c.Username != "" || c.KubernetesUser != gc {
		t.Fatalf("caller of the garbage collector: %+v; want a cluster controller with the operator's client and no Coder user", c)
	}
	me, err := c.Client.User(ctx, codersdk.Me)
	if err != nil {
		t.Fatal(err)
	}
	if me.Username != d.c.Username {
		t.Errorf("the garbage collector acts as %q, want the operator's owner %q", me.Username, d.c.Username)
	}
	if _, err := c.Allowed(ctx, []Check{{Resource: codersdk.ResourceWorkspace, Action: codersdk.ActionRead}}); err == nil {
		t.Error("Allowed answered for a cluster controller, which has no Coder user to ask about")
	}
	if s.Minted() != 0 {
		t.Errorf("a cluster controller minted %d tokens", s.Minted())
	}

	// No call to coderd: it is served with a coderd that does not answer.
	gone := d.cd
	gone.Key += " gone"
	gone.Owner = codersdk.New(&url.URL{Scheme: "http", Host: "127.0.0.1:1"})
	if c, err := s.Caller(ctx, gone, k8sUser("system:kube-controller-manager")); err != nil || !c.ClusterController || c.Client != gone.Owner {
		t.Errorf("kube-controller-manager with a coderd that does not answer: %+v, %v", c, err)
	}

	// Exact names only, and only these; in Operator mode nobody is
	// mapped (storage acts as the operator), so nothing is special.
	for _, name := range []string{"system:serviceaccount:kube-system:namespace-controller", gc + "-2"} {
		_, err := s.Caller(ctx, d.cd, k8sUser(name))
		want := fmt.Sprintf(`Kubernetes user %q is a system user, which maps to a Coder user only through an explicit mapping (spec.identity.mappings)`, name)
		if !IsRefused(err) || err.Error() != want {
			t.Errorf("%s: %v, want the refusal %q", name, err, want)
		}
	}
	op := d.cd
	op.Rules.Mode = ModeOperator
	if c, err := s.Caller(ctx, op, k8sUser(gc)); err == nil && c.ClusterController {
		t.Errorf("in Operator mode the garbage collector is a cluster controller: %+v", c)
	}
}

// An operator token rotated and revoked is never used again: users mapped
// before the rotation keep working, through a re-mint (their token
// revoked in coderd), a renewal, and the revocation of their tokens.
func TestOwnerTokenRotation(t *testing.T) {
	d := newCoderd(t, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	ctx := t.Context()
	s, clk, shutdown := runOnClock(t)
	defer shutdown()

	// Two operator tokens of the owner, as operatoraccess rotates them.
	ownerSession := func(name string) (*codersdk.Client, string) {
		res, err := d.c.Client.CreateToken(ctx, codersdk.Me, codersdk.CreateTokenRequest{Lifetime: 24 * time.Hour, TokenName: name})
		if err != nil {
			t.Fatal(err)
		}
		return coderapi.NewClient(d.c.URL, res.Key, 0, coderapi.Target{}), keyID(res.Key)
	}
	ownerA, idA := ownerSession("operator-a")
	ownerB, _ := ownerSession("operator-b")
	cdA, cdB := d.cd, d.cd
	cdA.Owner, cdB.Owner = ownerA, ownerB

	// request is one request of a Kubernetes user as the storage makes
	// it: the caller for the backend as it is now, then coderd.
	request := func(cd Coderd, who string) *Caller {
		t.Helper()
		c, err := s.Caller(ctx, cd, k8sUser(who))
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if _, err := c.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
			t.Fatalf("request of %s: %v", who, err)
		}
		return c
	}
	before := request(cdA, "alice@example.com")
	request(cdA, "bob@example.com")
	first := tokensOf(t, d.owner, "alice")
	if len(first) != 1 {
		t.Fatalf("alice's tokens: %+v", first)
	}

	// The operator token rotates: A is revoked, the backend serves B.
	if err := d.owner.DeleteAPIKey(ctx, d.c.Username, idA); err != nil {
		t.Fatal(err)
	}
	if _, err := ownerA.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
		t.Fatalf("operator token A after its revocation: %v, want 401", err)
	}
	request(cdB, "alice@example.com")
	if _, err := before.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatalf("request with alice's caller from before the rotation: %v", err)
	}

	// A forced re-mint: alice's token revoked in coderd.
	if err := d.owner.DeleteAPIKey(ctx, "alice", first[0].ID); err != nil {
		t.Fatal(err)
	}
	request(cdB, "alice@example.com")
	second := tokensOf(t, d.owner, "alice")
	if len(second) != 1 || second[0].ID == first[0].ID || s.Minted() != 3 {
		t.Fatalf("after alice's token was revoked: tokens %+v, minted %d; want one new token, 3 minted", second, s.Minted())
	}

	// Bob made no request since the rotation: his idle token is revoked
	// with B too (as is alice's).
	clk.Add(16 * time.Minute)
	s.evictIdle()
	testenv.WaitFor(t, 10*time.Second, func() error {
		for _, u := range []string{"alice", "bob"} {
			if left := tokensOf(t, d.owner, u); len(left) != 0 {
				return fmt.Errorf("%s's tokens after they went idle: %+v", u, left)
			}
		}
		return nil
	})

	// A renewal 46 minutes on: minted and the old token revoked with B.
	request(cdB, "alice@example.com")
	third := tokensOf(t, d.owner, "alice")
	clk.Add(46 * time.Minute)
	request(cdB, "alice@example.com")
	testenv.WaitFor(t, 10*time.Second, func() error {
		if next := tokensOf(t, d.owner, "alice"); len(next) != 1 || len(third) != 1 || next[0].ID == third[0].ID {
			return fmt.Errorf("alice's tokens after renewal: %+v (before: %+v), want only a new one", next, third)
		}
		return nil
	})
	request(cdB, "bob@example.com")

	// Shutdown revokes every token held, with B.
	shutdown()
	for _, u := range []string{"alice", "bob"} {
		if left := tokensOf(t, d.owner, u); len(left) != 0 {
			t.Errorf("%s's tokens after shutdown: %+v", u, left)
		}
	}
}

// tokensOf returns the coder-k8s tokens of a Coder user.
func tokensOf(t testing.TB, owner *codersdk.Client, username string) []codersdk.APIKeyWithOwner {
	t.Helper()
	keys, err := owner.Tokens(context.Background(), username, codersdk.TokensFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []codersdk.APIKeyWithOwner
	for _, k := range keys {
		if strings.HasPrefix(k.TokenName, "coder-k8s_") {
			out = append(out, k)
		}
	}
	return out
}

// clock is a settable time for the service.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// runOnClock runs a Service on a clock the test moves, with no grace
// period, until shutdown, which returns once Run has returned (and may be
// called again).
func runOnClock(t *testing.T) (s *Service, clk *clock, shutdown func()) {
	t.Helper()
	clk = &clock{now: time.Now()}
	s = New(testr.New(t), Options{})
	s.now, s.grace = clk.Now, 0
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(runCtx) }()
	return s, clk, func() { stop(); <-done }
}

func TestTokens(t *testing.T) {
	d := newCoderd(t, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	ctx := t.Context()
	s, clk, shutdown := runOnClock(t)

	alice, err := s.Caller(ctx, d.cd, k8sUser("alice@example.com"))
	if err != nil {
		t.Fatal(err)
	}
	if got := tokensOf(t, d.owner, "alice"); len(got) != 0 {
		t.Fatalf("tokens before any request: %+v", got)
	}
	if _, err := alice.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatal(err)
	}
	again, err := s.Caller(ctx, d.cd, k8sUser("alice@example.com"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatal(err)
	}
	keys := tokensOf(t, d.owner, "alice")
	if len(keys) != 1 || keys[0].LifetimeSeconds != 3600 || !strings.HasPrefix(keys[0].TokenName, "coder-k8s_ns_cp_") {
		t.Fatalf("alice's tokens after two callers' requests: %+v, want one named coder-k8s_ns_cp_… with a lifetime of 3600 s", keys)
	}
	if s.Minted() != 1 {
		t.Errorf("minted %d tokens, want 1", s.Minted())
	}

	// Revoked in coderd: the next request gets 401, a new token, and
	// succeeds.
	if err := d.owner.DeleteAPIKey(ctx, "alice", keys[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatalf("request after the token was revoked: %v", err)
	}
	if next := tokensOf(t, d.owner, "alice"); len(next) != 1 || next[0].ID == keys[0].ID || s.Minted() != 2 {
		t.Fatalf("after a revocation: tokens %+v, minted %d; want one new token, 2 minted", next, s.Minted())
	}

	// Renewed before it ends: 46 minutes on, less than 15 are left.
	cur := tokensOf(t, d.owner, "alice")[0]
	clk.Add(46 * time.Minute)
	if _, err := alice.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, func() error {
		next := tokensOf(t, d.owner, "alice")
		if len(next) != 1 || next[0].ID == cur.ID {
			return fmt.Errorf("tokens after renewal: %+v, want only a new one (the old one revoked)", next)
		}
		return nil
	})

	// Idle: revoked, and minted again when the caller comes back.
	clk.Add(16 * time.Minute)
	s.evictIdle()
	testenv.WaitFor(t, 10*time.Second, func() error {
		if left := tokensOf(t, d.owner, "alice"); len(left) != 0 {
			return fmt.Errorf("tokens of an idle caller: %+v", left)
		}
		return nil
	})
	if _, err := alice.Client.Workspaces(ctx, codersdk.WorkspaceFilter{}); err != nil {
		t.Fatalf("request of a caller whose token was evicted: %v", err)
	}

	// A forbidden request is coderd's 403, never retried as anyone else.
	bob, err := s.Caller(ctx, d.cd, k8sUser("bob@example.com"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = bob.Client.CreateUserWorkspace(ctx, "alice", codersdk.CreateWorkspaceRequest{Name: "x", TemplateID: uuid.New()})
	if coderapi.StatusCode(err) != http.StatusForbidden && coderapi.StatusCode(err) != http.StatusBadRequest {
		t.Errorf("bob creating a workspace for alice: %v, want coderd's refusal", err)
	}

	// Shutdown revokes every token held.
	shutdown()
	for _, u := range []string{"alice", "bob"} {
		if left := tokensOf(t, d.owner, u); len(left) != 0 {
			t.Errorf("%s's tokens after shutdown: %+v", u, left)
		}
	}
}

// BenchmarkTokensPerHour runs the service in real time against a real
// coderd with every token duration scaled down by tokensPerHourScale (a
// 40 s token replaced with 10 s left, as an hour's with 15 minutes left),
// every user calling every 5 scaled minutes for tokensPerHourHours scaled
// hours, and reports the tokens it really minted per user per scaled hour
// (target ≤ 2). Every call must succeed with the token it was given: a
// token that expired in coderd before it was replaced would cost a 401
// and another mint, which the figure would show.
func BenchmarkTokensPerHour(b *testing.B) {
	const (
		tokensPerHourScale = 90 // an hour is 40 s
		tokensPerHourHours = 3
	)
	d := newCoderd(b, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	ctx := context.Background()
	s := New(logr.Discard(), Options{})
	s.lifetime, s.renew, s.grace = TokenLifetime/tokensPerHourScale, renewBefore/tokensPerHourScale, revokeGrace/tokensPerHourScale
	hour := time.Hour / tokensPerHourScale
	users := []string{"alice@example.com", "bob@example.com"}
	b.ResetTimer()
	start := time.Now()
	tick := time.NewTicker(5 * time.Minute / tokensPerHourScale)
	defer tick.Stop()
	calls := 0
	for time.Since(start) < tokensPerHourHours*hour {
		for _, u := range users {
			c, err := s.Caller(ctx, d.cd, k8sUser(u))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Client.User(ctx, codersdk.Me); err != nil {
				b.Fatalf("%s's call %d: %v", u, calls, err)
			}
			calls++
		}
		<-tick.C
	}
	elapsed := time.Since(start)
	b.StopTimer()
	hours := float64(elapsed) / float64(hour)
	perHour := float64(s.Minted()) / float64(len(users)) / hours
	b.ReportMetric(perHour, "tokens/user/h")
	b.Logf("tokens minted per user per hour of steady use: %.2f (target ≤ 2; %d tokens minted in coderd for %d users over %.2f hours, each %s of real time with %s tokens, %d calls)",
		perHour, s.Minted(), len(users), hours, hour, s.lifetime, calls)
	if perHour > 2 {
		b.Errorf("%.2f tokens per user per hour, want ≤ 2", perHour)
	}
}
