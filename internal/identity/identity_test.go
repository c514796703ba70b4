package identity

import (
	"context"
	"fmt"
	"net/http"
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

// coderd is a real coderd with an owner (admin), two members (alice, bob)
// and a suspended user (carol), reached by the operator's client.
type coderd struct {
	c     *testenv.Coder
	owner *codersdk.Client
	cd    Coderd
}

func newCoderd(t testing.TB, rules Rules) *coderd {
	t.Helper()
	c := testenv.NewCoder(t, testenv.CoderOptions{})
	ctx := t.Context()
	for _, u := range []string{"alice", "bob", "carol"} {
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
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New(testr.New(t))
			cd := d.cd
			tc.rules.Mode = ModeMapped
			cd.Rules = tc.rules
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

func TestTokens(t *testing.T) {
	d := newCoderd(t, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	ctx := t.Context()
	clk := &clock{now: time.Now()}
	s := New(testr.New(t))
	s.now, s.grace = clk.Now, 0
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(runCtx) }()

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
	stop()
	<-done
	for _, u := range []string{"alice", "bob"} {
		if left := tokensOf(t, d.owner, u); len(left) != 0 {
			t.Errorf("%s's tokens after shutdown: %+v", u, left)
		}
	}
}

// BenchmarkTokensPerHour simulates six hours of steady use (every user
// calls every 5 minutes) with the service's clock, against a real coderd,
// and reports how many tokens each user costs per hour (target ≤ 2).
func BenchmarkTokensPerHour(b *testing.B) {
	d := newCoderd(b, Rules{Mode: ModeMapped, MatchField: MatchEmail})
	ctx := context.Background()
	clk := &clock{now: time.Now()}
	s := New(logr.Discard())
	s.now, s.grace = clk.Now, 0
	users := []string{"alice@example.com", "bob@example.com"}
	const hours = 6
	b.ResetTimer()
	for range hours * 60 / 5 {
		for _, u := range users {
			c, err := s.Caller(ctx, d.cd, k8sUser(u))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.Client.User(ctx, codersdk.Me); err != nil {
				b.Fatal(err)
			}
		}
		clk.Add(5 * time.Minute)
	}
	b.StopTimer()
	perHour := float64(s.Minted()) / float64(len(users)) / hours
	b.ReportMetric(perHour, "tokens/user/h")
	b.Logf("tokens minted per user per hour of steady use: %.2f (target ≤ 2; %d tokens for %d users over %d simulated hours)", perHour, s.Minted(), len(users), hours)
	if perHour > 2 {
		b.Errorf("%.2f tokens per user per hour, want ≤ 2", perHour)
	}
}
