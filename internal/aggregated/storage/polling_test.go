package storage

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr/testr"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// faultProxy forwards to the real coderd, except that GET
// /api/v2/workspaces requests whose query matches an armed fault are
// answered as coderd's rate limiter answers (429, Retry-After in seconds,
// coderd's JSON message; see coderd/httpmw/ratelimit.go and go-chi/httprate)
// or held until released: the two things the real coderd cannot be made to
// do on demand for one page. It records when each list request arrived,
// and counts (and, armed, holds) requests for build parameters.
type faultProxy struct {
	URL *url.URL

	mu         sync.Mutex
	limitPage  string // query offset answered 429; "" none
	stall      chan struct{}
	lists      []listRequest
	params     int
	paramStall chan struct{}
}

type listRequest struct {
	at     time.Time
	offset string
	status int
}

func newFaultProxy(t *testing.T, target *url.URL) *faultProxy {
	t.Helper()
	p := &faultProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/api/v2/workspacebuilds/") && strings.HasSuffix(r.URL.Path, "/parameters") {
			p.mu.Lock()
			p.params++
			stall := p.paramStall
			p.mu.Unlock()
			if !held(stall, r) {
				return
			}
			rp.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet || r.URL.Path != "/api/v2/workspaces" {
			rp.ServeHTTP(w, r)
			return
		}
		offset := r.URL.Query().Get("offset")
		p.mu.Lock()
		limited := p.limitPage != "" && p.limitPage == offset
		stall := p.stall
		status := http.StatusOK
		if limited {
			status = http.StatusTooManyRequests
		}
		p.lists = append(p.lists, listRequest{at: time.Now(), offset: offset, status: status})
		p.mu.Unlock()
		if !held(stall, r) {
			return
		}
		if limited {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "2")
			w.Header().Set("X-Ratelimit-Limit", "512")
			w.Header().Set("X-Ratelimit-Remaining", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"message":"You've been rate limited for sending more than 512 requests in 1m0s."}` + "\n"))
			return
		}
		rp.ServeHTTP(w, r)
	})}
	p.URL = serveLocal(t, srv)
	return p
}

// serveLocal serves srv on a free port of 127.0.0.1 until the test ends,
// closing it then without waiting for the requests it holds, and returns
// its URL.
func serveLocal(t *testing.T, srv *http.Server) *url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &url.URL{Scheme: "http", Host: l.Addr().String()}
}

func (p *faultProxy) set(limitPage string, stall chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limitPage, p.stall = limitPage, stall
}

// held waits until stall (nil: none) is closed; false if r ended first.
func held(stall chan struct{}, r *http.Request) bool {
	if stall == nil {
		return true
	}
	select {
	case <-stall:
		return true
	case <-r.Context().Done():
		return false
	}
}

// holdParams holds build parameter requests until release is closed.
func (p *faultProxy) holdParams(release chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paramStall = release
}

// paramRequests is how many build parameter requests arrived.
func (p *faultProxy) paramRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.params
}

func (p *faultProxy) requests() []listRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]listRequest(nil), p.lists...)
}

// pollStack is one real coderd with workspaces, seen by a workspace
// storage through fault proxies, one namespace per proxy.
type pollStack struct {
	coder   *testenv.Coder
	wss     *WorkspaceStorage
	proxies map[string]*faultProxy
	names   []string
	org     string
}

func newPollStack(t *testing.T, workspaces int, pageSize int, interval time.Duration, namespaces ...string) *pollStack {
	t.Helper()
	ctx := context.Background()
	c := testenv.NewCoder(t, testenv.CoderOptions{})
	if _, err := c.PushTemplate(ctx, "paged", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	org, err := c.Client.Organization(ctx, c.OrganizationID)
	if err != nil {
		t.Fatal(err)
	}
	ps := &pollStack{coder: c, proxies: map[string]*faultProxy{}, org: org.Name}
	for i := range workspaces {
		name := "ws" + string(rune('a'+i))
		if _, err := c.CreateWorkspace(ctx, "paged", name); err != nil {
			t.Fatal(err)
		}
		ps.names = append(ps.names, name)
	}
	var backends []backend.Backend
	for _, ns := range namespaces {
		p := newFaultProxy(t, c.URL)
		ps.proxies[ns] = p
		backends = append(backends, backend.Backend{Namespace: ns, URL: p.URL,
			Client: coderapi.NewClient(p.URL, c.SessionToken, 30*time.Second, coderapi.Target{})})
	}
	wss, err := NewWorkspaces(Options{Backends: fxProvider{backends: backends}, PollInterval: interval,
		Log: testr.New(t), WorkspacePageSize: pageSize})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { wss.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ps.wss = wss
	return ps
}

// objectName is the object name of workspace name of the first user.
func (ps *pollStack) objectName(name string) string {
	return ps.org + "." + ps.coder.Username + "." + name
}

func (ps *pollStack) watch(t *testing.T, ns string) watch.Interface {
	t.Helper()
	w, err := ps.wss.Watch(genericapirequest.WithNamespace(context.Background(), ns), &metainternalversion.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// nextPollEvent returns the next event within d, or ok=false.
func nextPollEvent(w watch.Interface, d time.Duration) (watch.Event, bool) {
	select {
	case ev := <-w.ResultChan():
		return ev, true
	case <-time.After(d):
		return watch.Event{}, false
	}
}

func wsOf(ev watch.Event) *aggv1.CoderWorkspace { return ev.Object.(*aggv1.CoderWorkspace) }

// stoppedWS reports whether o is a workspace whose latest build stops it.
func stoppedWS(o any) bool {
	w, ok := o.(*aggv1.CoderWorkspace)
	return ok && w.Status.LatestBuild != nil && w.Status.LatestBuild.Transition == string(codersdk.WorkspaceTransitionStop)
}

// TestPagedListsAndRateLimitedPages runs against a real coderd with more
// workspaces than one page: two LISTs at once of the cold cache show each
// workspace exactly once and ask coderd once per build for its
// parameters; the watch shows each workspace once; a page answered 429
// with Retry-After keeps every known workspace (no DELETED), the next list
// waits at least Retry-After, and then changes arrive.
func TestPagedListsAndRateLimitedPages(t *testing.T) {
	const ns = "team-a"
	ps := newPollStack(t, 5, 2, 300*time.Millisecond, ns)
	p := ps.proxies[ns]
	ctx := genericapirequest.WithNamespace(context.Background(), ns)

	// The first LIST's parameter requests are held until the second LIST
	// has read its pages and wants the same builds' parameters.
	release := make(chan struct{})
	p.holdParams(release)
	lists := make([]runtime.Object, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	list := func(i int) {
		wg.Go(func() { lists[i], errs[i] = ps.wss.List(ctx, &metainternalversion.ListOptions{}) })
	}
	list(0)
	waitFor(t, 10*time.Second, "the first LIST's parameter requests", func() bool { return p.paramRequests() > 0 })
	list(1)
	waitFor(t, 10*time.Second, "the second LIST's pages", func() bool { return len(p.requests()) == 6 })
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	p.holdParams(nil)
	for i, out := range lists {
		if errs[i] != nil {
			t.Fatalf("LIST %d: %v", i, errs[i])
		}
		seen := map[string]int{}
		for _, w := range out.(*workspaceList).Items {
			seen[w.Name]++
			if len(w.Spec.Parameters) != 0 {
				t.Errorf("LIST %d: %s has parameters %v; the template has none", i, w.Name, w.Spec.Parameters)
			}
		}
		for _, n := range ps.names {
			if seen[ps.objectName(n)] != 1 {
				t.Errorf("LIST %d shows %s %d times; want once (all: %v)", i, n, seen[ps.objectName(n)], seen)
			}
		}
		if len(seen) != len(ps.names) {
			t.Errorf("LIST %d shows %d workspaces; want %d: %v", i, len(seen), len(ps.names), seen)
		}
	}
	if got := p.paramRequests(); got != len(ps.names) {
		t.Errorf("two LISTs at once asked coderd %d times for build parameters; want %d, once per build", got, len(ps.names))
	}
	var offsets []string
	for _, r := range p.requests() {
		offsets = append(offsets, r.offset)
	}
	if got := strings.Join(offsets, ","); got != "0,2,4,0,2,4" {
		t.Errorf("the LISTs read pages at offsets %s; want 0,2,4 each (page size 2, 5 workspaces)", got)
	}

	w := ps.watch(t, ns)
	added := map[string]int{}
	for range ps.names {
		ev, ok := nextPollEvent(w, 10*time.Second)
		if !ok {
			t.Fatalf("watch: only %d initial events", len(added))
		}
		if ev.Type != watch.Added {
			t.Fatalf("watch: initial %s event for %s", ev.Type, wsOf(ev).Name)
		}
		added[wsOf(ev).Name]++
	}
	if len(added) != len(ps.names) {
		t.Fatalf("watch: ADDED %v; want each of %d workspaces once", added, len(ps.names))
	}

	// The second page is rate limited from now on.
	armed := time.Now()
	p.set("2", nil)
	// A workspace changes in coderd meanwhile; whichever page it is on,
	// nothing is DELETED while pages fail.
	if _, err := ps.coder.StopWorkspace(context.Background(), ps.names[4]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		ev, ok := nextPollEvent(w, time.Until(deadline))
		if !ok {
			break
		}
		if ev.Type == watch.Deleted {
			t.Fatalf("a rate-limited page deleted %s", wsOf(ev).Name)
		}
	}
	// Every list request after a 429 came at least Retry-After (2s) later.
	reqs := p.requests()
	limited := 0
	for i, r := range reqs {
		if r.status != http.StatusTooManyRequests || r.at.Before(armed) {
			continue
		}
		limited++
		for _, next := range reqs[i+1:] {
			if gap := next.at.Sub(r.at); gap < 2*time.Second {
				t.Errorf("list request %s after a 429 came %v later; want >= Retry-After 2s", next.offset, gap)
			}
			break
		}
	}
	if limited == 0 {
		t.Fatal("no list was rate limited")
	}
	if n := ps.wss.cache.Stats().Objects; n != len(ps.names) {
		t.Fatalf("cache holds %d workspaces while pages fail; want all %d kept", n, len(ps.names))
	}

	// Lifted: the stopped workspace's change arrives.
	p.set("", nil)
	stopped := ps.objectName(ps.names[4])
	deadline = time.Now().Add(10 * time.Second)
	for {
		if obj, ok := ps.wss.cache.Get(ns+"/", stopped); ok && stoppedWS(obj) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not shown stopped after the rate limit lifted", stopped)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHungCoderdDelaysOnlyItsNamespace lists one real coderd for two
// namespaces through two proxies; one proxy stops answering lists. The
// other namespace's watch still opens promptly and sees a change.
func TestHungCoderdDelaysOnlyItsNamespace(t *testing.T) {
	ps := newPollStack(t, 2, 0, 300*time.Millisecond, "team-a", "team-b")
	wb := ps.watch(t, "team-b")
	for range ps.names {
		if _, ok := nextPollEvent(wb, 10*time.Second); !ok {
			t.Fatal("team-b: initial events missing")
		}
	}
	stall := make(chan struct{})
	t.Cleanup(func() { close(stall) })
	ps.proxies["team-a"].set("", stall)
	// A watch of team-b from "now" reads coderd first; team-a's hung coderd
	// must not hold it.
	began := time.Now()
	wb2 := ps.watch(t, "team-b")
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("team-b watch took %v to open while team-a's coderd hangs", d)
	}
	for range ps.names {
		if _, ok := nextPollEvent(wb2, 10*time.Second); !ok {
			t.Fatal("team-b second watch: initial events missing")
		}
	}
	if _, err := ps.coder.StopWorkspace(context.Background(), ps.names[0]); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	want := ps.objectName(ps.names[0])
	for {
		ev, ok := nextPollEvent(wb, 10*time.Second)
		if !ok {
			t.Fatalf("team-b saw no change within 10s while team-a's coderd hangs")
		}
		if ev.Type == watch.Modified && wsOf(ev).Name == want && stoppedWS(ev.Object) {
			t.Logf("team-b saw the stop %v after the build finished", time.Since(changed))
			return
		}
	}
}
