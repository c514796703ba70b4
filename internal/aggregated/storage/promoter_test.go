package storage

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The settings of TestPromoterHungCoderd.
const (
	// phPoll is templateBuildWait.initialPollInterval (the default).
	phPoll = 2 * time.Second
	// phTimeout is templateBuildWait.timeout: long enough for the
	// measurements, which run while every hung build is still pending.
	phTimeout = 45 * time.Second
	// phCoderTimeout bounds each call to coderd
	// (aggregatedAPIServer.coder.requestTimeout), so a hung poll fails
	// after it.
	phCoderTimeout = 5 * time.Second
	// phSlack covers, on a loaded two-core machine, what follows the
	// poll that sees the import done: the promotion (three calls to
	// coderd), the record write, its informer event and the template's
	// re-read for the watch.
	phSlack = time.Second
	// phHungBuilds is the number of builds pending in the hung coderd.
	phHungBuilds = 20
)

// TestPromoterHungCoderd runs the promoter against two backends: fast
// (a coderd that builds) and hung (a coderd behind a proxy that stops
// answering, with 20 template builds pending). While the hung coderd
// holds every poll, templates of the fast one are still promoted within
// one poll interval of their import finishing, as a watch shows them; and
// once templateBuildWait.timeout has passed, the hung builds are recorded
// failed although no poll got an answer, saying since when coderd could
// not be reached, after an attempt to cancel the import.
func TestPromoterHungCoderd(t *testing.T) {
	ps := newPromoterStack(t)
	ctx := context.Background()
	fastCtx := genericapirequest.WithNamespace(ctx, "fast")
	hungCtx := genericapirequest.WithNamespace(ctx, "hung")

	// The hung coderd's provisioners run only echo jobs, so its
	// Terraform imports stay pending: 20 builds that never finish.
	for i := range phHungBuilds {
		name := fmt.Sprintf("%s.hung-%02d", ps.hungOrg, i)
		out, err := ps.tpls.Create(hungCtx, &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}, nil, &metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if got := readyOf(out.(*aggv1.CoderTemplate)); got != "False Building" {
			t.Fatalf("%s after the create: Ready %q, want False Building", name, got)
		}
	}
	ps.hungProxy.stall()
	stalled := time.Now()
	// The promoter is stuck on the hung coderd: it holds as many polls as
	// one coderd gets at once.
	testenv.WaitFor(t, 30*time.Second, func() error {
		if n := ps.hungProxy.count("GET /api/v2/templateversions/{id}"); n < coderapi.MaxParallel {
			return fmt.Errorf("the hung coderd holds %d polls, want %d", n, coderapi.MaxParallel)
		}
		return nil
	})

	t.Run("a template of the other coderd is promoted within one poll interval of its import's end", func(t *testing.T) {
		name := ps.fastOrg + ".fast"
		out, err := ps.tpls.Create(fastCtx, &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}, nil, &metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created := out.(*aggv1.CoderTemplate)
		w, err := ps.tpls.Watch(fastCtx, &metainternalversion.ListOptions{ResourceVersion: created.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		cur, _ := waitPromoted(t, fastCtx, ps, w, name, created.Status.ActiveVersionID)
		for i := range 3 {
			next := cur.DeepCopy()
			next.Spec.Files = map[string]string{"main.tf": fmt.Sprintf("output \"sample\" {\n  value = %d\n}\n", i)}
			out, _, err := ps.tpls.Update(fastCtx, name, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			building := out.(*aggv1.CoderTemplate).Status.BuildingVersionID
			if building == "" {
				t.Fatalf("update %d shows no building version", i)
			}
			var seen time.Time
			cur, seen = waitPromoted(t, fastCtx, ps, w, name, building)
			v, err := ps.fast.Client.TemplateVersion(ctx, uuid.MustParse(building))
			if err != nil {
				t.Fatal(err)
			}
			if v.Job.CompletedAt == nil {
				t.Fatalf("version %s is active but its import has no completion time", building)
			}
			delay := seen.Sub(*v.Job.CompletedAt)
			t.Logf("update %d: import finished %s after the update, promoted (seen by the watch) %s later; %d polls held by the hung coderd",
				i, v.Job.CompletedAt.Sub(v.CreatedAt).Round(time.Millisecond), delay.Round(time.Millisecond), ps.hungProxy.count("GET /api/v2/templateversions/{id}"))
			if delay > phPoll+phSlack {
				t.Errorf("update %d promoted %s after its import finished; want within the poll interval %s (+%s)", i, delay.Round(time.Millisecond), phPoll, phSlack)
			}
		}
	})

	t.Run("the hung coderd's builds are recorded failed after the timeout, saying since when coderd could not be reached", func(t *testing.T) {
		// A build is past the timeout phTimeout after it started; its next
		// check then holds a slot for a poll and a cancel that each wait
		// phCoderTimeout, and the hung coderd's 20 builds share 8 slots.
		within := phTimeout + phPoll + 3*2*phCoderTimeout + 10*time.Second
		failedAt := map[string]time.Time{}
		var recs []coderv1alpha1.CoderObjectRecord
		testenv.WaitFor(t, within, func() error {
			var l coderv1alpha1.CoderObjectRecordList
			if err := ps.kube.List(ctx, &l, client.InNamespace("hung")); err != nil {
				return err
			}
			recs = l.Items
			for _, r := range recs {
				if b := r.Spec.Build; b != nil && b.Failed && failedAt[r.Name].IsZero() {
					failedAt[r.Name] = time.Now()
				}
			}
			if len(recs) != phHungBuilds || len(failedAt) != phHungBuilds {
				return fmt.Errorf("%d of %d hung builds recorded failed", len(failedAt), phHungBuilds)
			}
			return nil
		})
		for _, r := range recs {
			b := r.Spec.Build
			if took := failedAt[r.Name].Sub(b.StartedAt.Time); took < phTimeout {
				t.Errorf("%s: recorded failed %s after it started, before the timeout %s", r.Spec.Name, took.Round(time.Millisecond), phTimeout)
			}
			since, ok := reachedSince(b.Error)
			if !ok || !strings.Contains(b.Error, "did not finish within "+phTimeout.String()) || !strings.Contains(b.Error, "could not cancel it") {
				t.Errorf("%s: error %q; want the timeout, since when coderd could not be reached, and the failed cancel", r.Spec.Name, b.Error)
				continue
			}
			// The first poll the proxy held began within a poll interval.
			if since.Before(stalled.Truncate(time.Second)) || since.After(stalled.Add(phPoll+time.Second)) {
				t.Errorf("%s: coderd could not be reached since %s; it stopped answering at %s", r.Spec.Name, since, stalled.UTC().Format(time.RFC3339))
			}
		}
		if n := ps.hungProxy.count("PATCH /api/v2/templateversions/{id}/cancel"); n < phHungBuilds {
			t.Errorf("the hung coderd was asked to cancel %d imports, want each of the %d", n, phHungBuilds)
		}
		t.Logf("records: %s", strings.Join(slices.Sorted(func(yield func(string) bool) {
			for _, r := range recs {
				if !yield(fmt.Sprintf("%s failed %s after it started", r.Spec.Name, failedAt[r.Name].Sub(r.Spec.Build.StartedAt.Time).Round(time.Second))) {
					return
				}
			}
		}), "; "))

		// What kubectl shows once coderd answers again.
		ps.hungProxy.resume()
		name := ps.hungOrg + ".hung-00"
		out, err := ps.tpls.Get(hungCtx, name, &metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := readyCondition(out.(*aggv1.CoderTemplate))
		if c.Reason != aggv1.ReasonBuildFailed || !strings.Contains(c.Message, "coderd could not be reached since") {
			t.Errorf("%s once coderd answers: Ready %s %s %q; want BuildFailed saying since when coderd could not be reached", name, c.Status, c.Reason, c.Message)
		}
	})
}

// waitPromoted waits for the watch to show template name with versionID
// active and built, and returns it and when the event arrived. On timeout
// it reports the events it saw, what a GET answers, and the goroutines
// of the watch cache and the storage (a watch gone silent is otherwise
// undiagnosable).
func waitPromoted(t *testing.T, ctx context.Context, ps *promoterStack, w watch.Interface, name, versionID string) (*aggv1.CoderTemplate, time.Time) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	var seen []string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch closed waiting for %s to show version %s active; events seen: %q", name, versionID, seen)
			}
			o, ok := ev.Object.(*aggv1.CoderTemplate)
			if !ok || o.Name != name {
				continue
			}
			c := readyCondition(o)
			seen = append(seen, fmt.Sprintf("%s rv=%s active=%s building=%s Ready=%s %s", ev.Type, o.ResourceVersion, o.Status.ActiveVersionID, o.Status.BuildingVersionID, c.Status, c.Reason))
			if o.Status.ActiveVersionID == versionID && o.Status.BuildingVersionID == "" && c.Status == metav1.ConditionTrue {
				return o, time.Now()
			}
		case <-timeout:
			t.Fatalf("the watch did not show %s with version %s active within 2m; events seen: %q\nGET: %s\ngoroutines:\n%s",
				name, versionID, seen, ps.describeTemplate(ctx, name), storageGoroutines())
		}
	}
}

// describeTemplate is what a GET of template name answers, within 10 s.
func (ps *promoterStack) describeTemplate(ctx context.Context, name string) string {
	got := make(chan string, 1)
	go func() {
		out, err := ps.tpls.Get(ctx, name, &metav1.GetOptions{})
		if err != nil {
			got <- err.Error()
			return
		}
		o := out.(*aggv1.CoderTemplate)
		c := readyCondition(o)
		got <- fmt.Sprintf("rv=%s active=%s building=%s Ready=%s %s %q", o.ResourceVersion, o.Status.ActiveVersionID, o.Status.BuildingVersionID, c.Status, c.Reason, c.Message)
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		return "no answer within 10s"
	}
}

// storageGoroutines are the stacks of the goroutines running code of the
// watch cache or this package.
func storageGoroutines() string {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "internal/aggregated/watchcache.") || strings.Contains(g, "internal/aggregated/storage.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// reachedSince finds the time T in "coderd could not be reached since T:"
// (RFC 3339, UTC, whole seconds).
func reachedSince(msg string) (time.Time, bool) {
	const utcSeconds = "2006-01-02T15:04:05Z"
	_, rest, ok := strings.Cut(msg, "coderd could not be reached since ")
	if !ok || len(rest) < len(utcSeconds) {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339, rest[:len(utcSeconds)])
	return at, err == nil
}

// promoterStack is two coderds (one PostgreSQL) seen as the backends of
// namespaces fast and hung, the second through a stallingProxy, and the
// template storage (promoter included) running against kube-apiserver.
type promoterStack struct {
	kube             client.Client
	tpls             *TemplateStorage
	fast, hung       *testenv.Coder
	hungProxy        *stallingProxy
	fastOrg, hungOrg string
}

func newPromoterStack(t *testing.T) *promoterStack {
	t.Helper()
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	// Without rate limits: coderd takes 12 file uploads a minute, fewer
	// than the test makes.
	ps := &promoterStack{
		fast: testenv.NewCoder(t, testenv.CoderOptions{Postgres: pg, DisableRateLimits: true}),
		hung: testenv.NewCoder(t, testenv.CoderOptions{Postgres: pg, DisableRateLimits: true,
			ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeEcho}}),
	}
	ps.hungProxy = newStallingProxy(t, ps.hung.URL)
	for _, c := range []struct {
		coder *testenv.Coder
		org   *string
	}{{ps.fast, &ps.fastOrg}, {ps.hung, &ps.hungOrg}} {
		org, err := c.coder.Client.Organization(ctx, c.coder.OrganizationID)
		if err != nil {
			t.Fatal(err)
		}
		*c.org = org.Name
	}

	var store *records.Store
	store, ps.kube = startRecords(t, ctx, k)
	for _, ns := range []string{"fast", "hung"} {
		if err := ps.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	backends := []backend.Backend{
		{Namespace: "fast", ControlPlane: "coder", URL: ps.fast.URL,
			Client: coderapi.NewClient(ps.fast.URL, ps.fast.SessionToken, phCoderTimeout, coderapi.Target{})},
		{Namespace: "hung", ControlPlane: "coder", URL: ps.hungProxy.URL,
			Client: coderapi.NewClient(ps.hungProxy.URL, ps.hung.SessionToken, phCoderTimeout, coderapi.Target{})},
	}
	// The watch poll is rare, so that what the watch shows of builds comes
	// from the promoter.
	o := Options{Backends: fxProvider{backends: backends}, PollInterval: 10 * time.Minute, Records: store, Log: testr.New(t)}
	ps.tpls, err = NewTemplates(o, TemplateOptions{Limits: templatesource.DefaultLimits, BuildWait: templatesource.WaitConfig{
		Timeout: phTimeout, BackoffAfter: 2 * time.Minute, InitialPollInterval: phPoll, MaxPollInterval: 10 * time.Second,
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { ps.tpls.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ps
}

// stallingProxy forwards to a coderd until stall is called; from then on
// it accepts every request and never answers (until the client gives up),
// as a hung coderd does, and counts the requests it held by endpoint.
type stallingProxy struct {
	URL *url.URL

	stalled atomic.Bool
	mu      sync.Mutex
	held    map[string]int
}

func newStallingProxy(t *testing.T, target *url.URL) *stallingProxy {
	t.Helper()
	p := &stallingProxy{held: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.stalled.Load() {
			rp.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		p.held[r.Method+" "+testenv.Endpoint(r.URL.Path)]++
		p.mu.Unlock()
		<-r.Context().Done()
	}), ReadHeaderTimeout: 10 * time.Second}
	p.URL = serveLocal(t, srv)
	return p
}

func (p *stallingProxy) stall()  { p.stalled.Store(true) }
func (p *stallingProxy) resume() { p.stalled.Store(false) }

// count is the number of requests to endpoint ("METHOD endpoint", see
// testenv.Endpoint) held so far.
func (p *stallingProxy) count(endpoint string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[endpoint]
}

// The promoter's queue paces each build's checks as templateBuildWait
// says: the initial interval until backoffAfter into the build, then
// doubling up to the maximum (the queue's exponential backoff, counted
// as requeues); an unconfigured interval is 2 s, not a busy loop.
func TestPromoterSchedule(t *testing.T) {
	wait := templatesource.WaitConfig{Timeout: time.Hour, BackoffAfter: time.Minute, InitialPollInterval: 2 * time.Second, MaxPollInterval: 10 * time.Second}
	for _, c := range []struct {
		name     string
		wait     templatesource.WaitConfig
		elapsed  time.Duration
		want     []time.Duration
		requeues int
	}{
		{"new build", wait, 0, []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}, 0},
		{"past backoffAfter", wait, 2 * time.Minute, []time.Duration{4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}, 4},
		{"nothing configured", templatesource.WaitConfig{}, 0, []time.Duration{2 * time.Second, 2 * time.Second}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, s := fxStorages(t)
			s.opts.BuildWait = c.wait
			p := newPromoter(s)
			defer p.queue.ShutDown()
			key := records.Key{Namespace: "team-a", Resource: coderv1alpha1.RecordResourceTemplates, CoderID: fxTemplateID.String()}
			started := time.Now().Add(-c.elapsed)
			var got []time.Duration
			for range c.want {
				got = append(got, p.pause(key, started))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("pauses %v, want %v", got, c.want)
			}
			if n := p.queue.NumRequeues(key); n != c.requeues {
				t.Errorf("NumRequeues = %d, want %d", n, c.requeues)
			}
		})
	}
}

// A backend's checks take at most its limit of slots at once, in the
// order they asked; another backend's checks are not held up by them.
func TestPromoterBackendSlots(t *testing.T) {
	b := &backendSlots{limit: 2, sems: map[string]*backendSem{}}
	ctx := context.Background()
	var releases []func()
	for range 2 {
		release, ok := b.acquire(ctx, "ns/hung")
		if !ok {
			t.Fatal("acquire of a free slot failed")
		}
		releases = append(releases, release)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, ok := b.acquire(waitCtx, "ns/hung"); ok {
		t.Fatal("a third check of a backend with two slots got one")
	}
	other, ok := b.acquire(ctx, "ns/fast")
	if !ok {
		t.Fatal("another backend's check waited for the full one's slots")
	}
	other()
	got := make(chan struct{})
	go func() {
		release, ok := b.acquire(ctx, "ns/hung")
		if ok {
			release()
		}
		close(got)
	}()
	releases[0]()
	<-got
	releases[1]()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sems) != 0 {
		t.Errorf("idle backends keep %d entries", len(b.sems))
	}
}
