package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkWorkspaces/Identity.
const (
	// benchMemberWorkspaces is how many workspaces the member owns among
	// the stack's others.
	benchMemberWorkspaces = 10
	// benchIdentityWatchers is how many different users watch at once.
	benchIdentityWatchers = 50
)

// benchIdentity measures Mapped mode on the stack's workspaces, each
// figure against a reference taken in the same run:
//
//   - a member's LIST of their benchMemberWorkspaces workspaces among all
//     the others, through kube-apiserver as that member, vs coderd's own
//     GET /api/v2/workspaces with the member's session token, with the
//     same HTTP client (medians of alternating requests);
//   - the list requests coder-k8s sends coderd per poll interval while 1
//     user watches, and while benchIdentityWatchers different users do
//     (counted by the proxy the control plane points at), with the
//     authorization checks and tokens that cost. Every watcher owns
//     workspaces (the member benchMemberWorkspaces, the others one each);
//     after the count a TTL changed in Coder on one workspace of each
//     watcher must reach that watcher's watch, and no watch may show an
//     object of another user.
func (st *benchStack) benchIdentity(b *testing.B, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	owner := st.coder.Client
	if exited, _ := st.op.Exited(); exited {
		// Startup, which runs before in make bench, stops the operator.
		st.op = st.startOperator(b, OperatorOptions{})
		st.routeAPIService(b, st.op)
	}

	// Coder users: the member with workspaces, and the other watchers.
	users := []string{"member"}
	for i := 1; i < benchIdentityWatchers; i++ {
		users = append(users, fmt.Sprintf("watcher%02d", i))
	}
	var memberToken string
	for _, u := range users {
		if _, err := owner.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: u + "@example.com", Username: u, Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{st.coder.OrganizationID}, UserLoginType: codersdk.LoginTypePassword,
		}); err != nil {
			b.Fatalf("create Coder user %s: %v", u, err)
		}
	}
	login, err := owner.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: "member@example.com", Password: "SomeSecurePassword!1"})
	if err != nil {
		b.Fatal(err)
	}
	memberToken = login.SessionToken
	tpl, err := owner.TemplateByName(ctx, st.coder.OrganizationID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	// The member owns benchMemberWorkspaces workspaces, every other
	// watcher one: each watch has its own objects to be told about.
	owned := map[string][]codersdk.Workspace{}
	for i, u := range users {
		count := 1
		if i == 0 {
			count = benchMemberWorkspaces
		}
		for j := range count {
			w, err := owner.CreateUserWorkspace(ctx, u, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: fmt.Sprintf("mine-%02d", j)})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := st.coder.WaitBuild(ctx, w.LatestBuild.ID); err != nil {
				b.Fatal(err)
			}
			owned[u] = append(owned[u], w)
		}
	}
	total := n + benchMemberWorkspaces + len(users) - 1

	// The control plane at coderd itself, in Mapped mode: the admin
	// client certificate maps to the owner explicitly, everyone else by
	// email; group devs may read workspaces.
	st.pointAt(b, st.coder.URL.String(), 5*time.Minute)
	st.setIdentity(b, coderv1alpha1.IdentitySpec{Mode: "Mapped", MatchBy: "Email",
		Mappings: []coderv1alpha1.IdentityMapping{{KubernetesUser: "admin", CoderUser: st.coder.Username}}})
	defer st.setIdentity(b, coderv1alpha1.IdentitySpec{Mode: "Operator"})
	for _, o := range []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "workspace-reader", Namespace: benchNS},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "devs-read-workspaces", Namespace: benchNS},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "workspace-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "devs"}}},
	} {
		if err := st.c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	configs := make([]*rest.Config, len(users))
	for i, u := range users {
		if configs[i], err = st.k.UserConfig(u+"@example.com", "devs"); err != nil {
			b.Fatal(err)
		}
	}

	// The member's LIST vs coderd's list for the member.
	hc := st.httpClientFor(b, configs[0], st.coder.URL.Host, codersdk.SessionTokenHeader, memberToken)
	agg := strings.TrimRight(st.k.Config.Host, "/") + "/apis/aggregation.coder.com/v1alpha1/namespaces/" + benchNS + "/coderworkspaces"
	coderd := st.coder.URL.String() + "/api/v2/workspaces"
	for _, c := range []struct{ url, field string }{{agg, "items"}, {coderd, "workspaces"}} {
		_, body, _, err := timedGet(hc, c.url, "")
		if err != nil {
			b.Fatal(err)
		}
		st.checkItems(b, "the member's list "+c.url, body, c.field, benchMemberWorkspaces)
	}
	aggMed, coderMed := alternateWith(b, hc, agg, coderd)
	ratio := aggMed.Seconds() / coderMed.Seconds()
	b.ReportMetric(ratio, "member-list-ratio")
	b.ReportMetric(float64(aggMed.Microseconds())/1000, "member-list-ms")
	b.ReportMetric(float64(coderMed.Microseconds())/1000, "coderd-member-list-ms")
	fmt.Printf("member list ratio=%.2f (target ≤ 1.2): a member's LIST of their %d workspaces among %d, median %s; coderd GET /api/v2/workspaces with the member's token, median %s; %d alternating pairs\n",
		ratio, benchMemberWorkspaces, total, aggMed.Round(100*time.Microsecond), coderMed.Round(100*time.Microsecond), benchListPairs)

	// List requests per poll with 1 watching user, then with 50.
	st.pointAt(b, st.proxy.URL.String(), 5*time.Minute)
	dyns := make([]dynamic.Interface, len(users))
	for i, cfg := range configs {
		c := rest.CopyConfig(cfg)
		c.QPS, c.Burst = 1000, 2000
		if dyns[i], err = dynamic.NewForConfig(c); err != nil {
			b.Fatal(err)
		}
	}
	perPoll := map[int]float64{}
	ttl := int64(time.Hour / time.Millisecond)
	for _, watching := range []int{1, benchIdentityWatchers} {
		wctx, stop := context.WithCancel(ctx)
		watches := make([]*identityWatch, watching)
		for i := range watching {
			l, err := dyns[i].Resource(workspacesGVR).Namespace(benchNS).List(wctx, metav1.ListOptions{})
			if err != nil {
				b.Fatalf("%s lists: %v", users[i], err)
			}
			if len(l.Items) != len(owned[users[i]]) {
				b.Fatalf("%s lists %d workspaces, want their %d", users[i], len(l.Items), len(owned[users[i]]))
			}
			w, err := dyns[i].Resource(workspacesGVR).Namespace(benchNS).Watch(wctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
			if err != nil {
				b.Fatalf("%s watches: %v", users[i], err)
			}
			watches[i] = watchAs(users[i], w)
		}
		// Settle, then count over benchWindow poll intervals.
		time.Sleep(2 * st.watchPollInterval())
		before := st.proxy.Stats()
		window := time.Duration(benchWindow) * st.watchPollInterval()
		time.Sleep(window)
		got := st.proxy.Stats().Since(before)
		lists := got["GET /api/v2/workspaces"].Requests
		perPoll[watching] = float64(lists) / benchWindow
		var tokens int64
		for k, v := range got {
			if strings.HasSuffix(k, "/keys/tokens") {
				tokens += v.Requests
			}
		}
		fmt.Printf("identity watch: %d different users watching: %d coderd list requests in %d poll intervals (%.2f per poll), %d authorization checks, %d tokens minted\n",
			watching, lists, benchWindow, perPoll[watching], got["POST /api/v2/authcheck"].Requests, tokens)

		// Then a change in Coder to one workspace of each watcher: each
		// watch must show its owner that change, and nothing of others'.
		ttl += int64(time.Minute / time.Millisecond)
		changed := time.Now()
		for _, w := range watches {
			if err := owner.UpdateWorkspaceTTL(ctx, owned[w.user][0].ID, codersdk.UpdateWorkspaceTTLRequest{TTLMillis: &ttl}); err != nil {
				b.Fatal(err)
			}
		}
		var delays []time.Duration
		for _, w := range watches {
			want := "coder." + w.user + "." + owned[w.user][0].Name
			d, err := w.waitTTL(want, ttl, changed, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			delays = append(delays, d)
		}
		stop()
		for _, w := range watches {
			if err := w.foreign(); err != nil {
				b.Fatal(err)
			}
		}
		fmt.Printf("identity watch: %d different users watching: a TTL changed in Coder on one workspace of each reached its owner's watch (and no other) in median %s, at most %s after the changes began\n",
			watching, percentile(delays, 50).Round(time.Millisecond), slices.Max(delays).Round(time.Millisecond))
	}
	b.ReportMetric(perPoll[1], "lists-per-poll-1-user")
	b.ReportMetric(perPoll[benchIdentityWatchers], "lists-per-poll-50-users")
	fmt.Printf("identity watch cost ratio=%.2f (target 1.0): coderd list requests per poll with %d users watching %.2f, with 1 user %.2f\n",
		perPoll[benchIdentityWatchers]/perPoll[1], benchIdentityWatchers, perPoll[benchIdentityWatchers], perPoll[1])
}

// setIdentity sets the bench control plane's spec.identity and waits until
// the controller reports it.
func (st *benchStack) setIdentity(b *testing.B, id coderv1alpha1.IdentitySpec) {
	b.Helper()
	ctx := context.Background()
	ccp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: benchCCPName, Namespace: benchNS}}
	mappings := id.Mappings
	if mappings == nil {
		mappings = []coderv1alpha1.IdentityMapping{}
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"identity": map[string]any{
		"mode": id.Mode, "matchBy": cmp.Or(id.MatchBy, "Email"), "mappings": mappings}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.c.Patch(ctx, ccp, client.RawPatch(types.MergePatchType, patch)); err != nil {
		b.Fatal(err)
	}
	want := metav1.ConditionTrue
	if id.Mode == "Operator" {
		want = metav1.ConditionFalse
	}
	testenv.WaitFor(b, time.Minute, func() error {
		if err := st.c.Get(ctx, client.ObjectKeyFromObject(ccp), ccp); err != nil {
			return err
		}
		for _, c := range ccp.Status.Conditions {
			if c.Type == coderv1alpha1.ConditionIdentityMapped && c.Status == want && c.ObservedGeneration == ccp.Generation {
				return nil
			}
		}
		return fmt.Errorf("IdentityMapped is not %s for generation %d", want, ccp.Generation)
	})
	// The aggregated server reads the control plane from its informer.
	time.Sleep(time.Second)
}

// alternateWith is alternate with the client hc.
func alternateWith(b *testing.B, hc *http.Client, a, c string) (time.Duration, time.Duration) {
	b.Helper()
	var as, cs []time.Duration
	for i := range benchListWarmup + benchListPairs {
		order := []string{a, c}
		if i%2 == 1 {
			order = []string{c, a}
		}
		for _, u := range order {
			d, _, _, err := timedGet(hc, u, "")
			if err != nil {
				b.Fatal(err)
			}
			if i < benchListWarmup {
				continue
			}
			if u == a {
				as = append(as, d)
			} else {
				cs = append(cs, d)
			}
		}
	}
	return percentile(as, 50), percentile(cs, 50)
}

// identityWatch drains one user's watch, keeping what it showed.
type identityWatch struct {
	user string
	mu   sync.Mutex
	// ttl is the latest spec.ttlMillis seen per object name, with when.
	ttl  map[string]int64
	seen map[string]time.Time
	// others are objects shown that are not the user's.
	others []string
}

func watchAs(user string, w watch.Interface) *identityWatch {
	iw := &identityWatch{user: user, ttl: map[string]int64{}, seen: map[string]time.Time{}}
	go func() {
		for ev := range w.ResultChan() {
			o, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Bookmark || ev.Type == watch.Error {
				continue
			}
			iw.mu.Lock()
			if !strings.HasPrefix(o.GetName(), "coder."+user+".") {
				iw.others = append(iw.others, string(ev.Type)+" "+o.GetName())
			}
			ttl, _, _ := unstructured.NestedInt64(o.Object, "spec", "ttlMillis")
			iw.ttl[o.GetName()], iw.seen[o.GetName()] = ttl, time.Now()
			iw.mu.Unlock()
		}
	}()
	return iw
}

// waitTTL waits until the watch showed name with spec.ttlMillis ttl and
// returns when, after since.
func (w *identityWatch) waitTTL(name string, ttl int64, since time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		got, at := w.ttl[name], w.seen[name]
		w.mu.Unlock()
		if got == ttl {
			return at.Sub(since), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s's watch did not show %s with ttlMillis %d within %s (last seen %d)", w.user, name, ttl, timeout, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// foreign fails if the watch showed any object not the user's.
func (w *identityWatch) foreign() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.others) > 0 {
		return fmt.Errorf("%s's watch showed %d objects of others, first %s", w.user, len(w.others), w.others[0])
	}
	return nil
}
