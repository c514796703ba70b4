package watchcache

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	clocktesting "k8s.io/utils/clock/testing"
)

const interval = 5 * time.Second

func newPolledCache(t *testing.T, srcs ...Source) (*Cache, *clocktesting.FakeClock, *fakeSources) {
	t.Helper()
	fs := &fakeSources{}
	fs.set(srcs...)
	c, fc := newTestCache(t, Options{Sources: fs.list, Interval: interval})
	return c, fc, fs
}

// runCache starts Run and stops it (waiting for it) at test end.
func runCache(t *testing.T, c *Cache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func polls(c *Cache) uint64 { return c.Stats().Polls }

// flightWaiters is how many callers wait on the running poll if it is the
// gen-th one, else -1.
func flightWaiters(c *Cache, gen uint64) int {
	c.pollMu.Lock()
	defer c.pollMu.Unlock()
	if f := c.pollFlight; f != nil && f.gen == gen {
		return f.waiters
	}
	return -1
}

func TestPollerPollsOnlyWhileWatched(t *testing.T) {
	src := newFakeSource("ns/cp", obj("ns", "a", nil))
	c, fc, _ := newPolledCache(t, src)
	runCache(t, c)

	// Unwatched: time passes, nothing is listed.
	time.Sleep(20 * time.Millisecond)
	fc.Step(3 * interval)
	time.Sleep(20 * time.Millisecond)
	if n := src.calls.Load(); n != 0 {
		t.Fatalf("listed %d times without watchers", n)
	}

	// The first watcher triggers a prompt poll, without the clock moving.
	began := time.Now()
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/a"})
	if d := time.Since(began); d > time.Second {
		t.Fatalf("first poll took %v", d)
	}
	if !c.Synced("ns/cp") {
		t.Fatal("polled backend not synced")
	}

	// Then one poll per interval.
	waitFor(t, "poll timer", fc.HasWaiters)
	src.set(obj("ns", "a", nil), obj("ns", "b", nil))
	fc.Step(interval)
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns/b"})
	waitFor(t, "second poll", func() bool { return polls(c) == 2 })

	// Watcher gone: the timer fires once more but no poll follows.
	w.Stop()
	waitFor(t, "poll timer", fc.HasWaiters)
	fc.Step(interval)
	waitFor(t, "loop idle", func() bool { return !fc.HasWaiters() })
	fc.Step(3 * interval)
	time.Sleep(20 * time.Millisecond)
	if n := polls(c); n != 2 {
		t.Fatalf("polls = %d without watchers; want 2", n)
	}

	// A new watcher wakes it again.
	w2 := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	waitFor(t, "third poll", func() bool { return polls(c) == 3 })
	expectNoEvent(t, w2)
}

func TestPollerWakesWhenWatcherReturnsDuringWait(t *testing.T) {
	src := newFakeSource("ns/cp")
	c, fc, _ := newPolledCache(t, src)
	runCache(t, c)
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	waitFor(t, "first poll", func() bool { return polls(c) == 1 })
	waitFor(t, "poll timer", fc.HasWaiters)
	// The only watcher leaves and another arrives while the loop waits for
	// its timer: the newcomer gets a poll now, not an interval later.
	w.Stop()
	startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	waitFor(t, "prompt poll", func() bool { return polls(c) == 2 })
}

func TestPollerOneListPerSourcePerIntervalRegardlessOfWatchers(t *testing.T) {
	srcs := []*fakeSource{
		newFakeSource("ns1/cp", obj("ns1", "a", nil)),
		newFakeSource("ns2/cp", obj("ns2", "b", nil)),
		newFakeSource("ns3/cp", obj("ns3", "c", nil)),
	}
	c, fc, _ := newPolledCache(t, srcs[0], srcs[1], srcs[2])
	var ws []watch.Interface
	for range 50 {
		ws = append(ws, startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()}))
	}
	runCache(t, c)
	for i := range 3 {
		waitFor(t, "poll", func() bool { return polls(c) == uint64(i+1) })
		waitFor(t, "poll timer", fc.HasWaiters)
		fc.Step(interval)
	}
	waitFor(t, "fourth poll", func() bool { return polls(c) == 4 })
	for _, s := range srcs {
		if n := s.calls.Load(); n != 4 {
			t.Fatalf("%s listed %d times in 4 polls", s.key, n)
		}
	}
	for _, w := range ws {
		if got := len(nextEvents(t, w, 3)); got != 3 {
			t.Fatalf("watcher got %d events", got)
		}
	}
	if n := c.Stats().Watchers; n != 50 {
		t.Fatalf("watchers = %d", n)
	}
}

func TestPollerListsConcurrentlyWithinBound(t *testing.T) {
	gate := make(chan struct{})
	var srcs []Source
	var fakes []*fakeSource
	for i := range 5 {
		s := newFakeSource("k" + string(rune('a'+i)))
		s.setBlock(gate)
		srcs = append(srcs, s)
		fakes = append(fakes, s)
	}
	fs := &fakeSources{}
	fs.set(srcs...)
	c, _ := newTestCache(t, Options{Sources: fs.list, ListConcurrency: 2})
	done := make(chan error, 1)
	go func() { done <- c.Refresh(context.Background()) }()
	inFlight := func() int64 {
		var n int64
		for _, s := range fakes {
			n += s.calls.Load()
		}
		return n
	}
	waitFor(t, "two lists in flight", func() bool { return inFlight() == 2 })
	time.Sleep(20 * time.Millisecond)
	if n := inFlight(); n != 2 {
		t.Fatalf("%d lists started with a bound of 2", n)
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := inFlight(); n != 5 {
		t.Fatalf("%d lists; want 5", n)
	}
}

func TestRefreshCoalesces(t *testing.T) {
	src := newFakeSource("ns/cp", obj("ns", "a", nil))
	c, _, _ := newPolledCache(t, src)

	gate1 := make(chan struct{})
	src.setBlock(gate1)
	first := make(chan error, 1)
	go func() { first <- c.Refresh(context.Background()) }()
	<-src.entered

	// Callers arriving during a poll must not trust it (it may have listed
	// before their write); they all share the single next poll.
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.Refresh(context.Background())
		}()
	}
	// The first caller waits on its own poll too.
	waitFor(t, "callers waiting", func() bool { return flightWaiters(c, 1) == n+1 })

	gate2 := make(chan struct{})
	src.setBlock(gate2)
	close(gate1)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-src.entered
	waitFor(t, "callers joined the second poll", func() bool { return flightWaiters(c, 2) == n })
	close(gate2)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := src.calls.Load(); got != 2 {
		t.Fatalf("List called %d times for %d+1 Refresh calls; want 2", got, n)
	}
	if got := polls(c); got != 2 {
		t.Fatalf("polls = %d; want 2", got)
	}
}

func TestRefreshRetriesWhenRunnerGivesUp(t *testing.T) {
	src := newFakeSource("ns/cp", obj("ns", "a", nil))
	c, _, _ := newPolledCache(t, src)
	gate := make(chan struct{})
	src.setBlock(gate)

	ctx1, cancel1 := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- c.Refresh(ctx1) }()
	<-src.entered

	// A caller whose poll was started by another caller (the loop) joins it.
	second := make(chan error, 1)
	go func() { second <- c.refresh(context.Background(), false, nil) }()
	waitFor(t, "joined", func() bool { return flightWaiters(c, 1) == 2 })
	cancel1()
	if err := <-first; err == nil {
		t.Fatal("cancelled Refresh succeeded")
	}
	// The joiner's own context is alive, so it polls again instead of
	// inheriting the cancellation.
	<-src.entered
	close(gate)
	if err := <-second; err != nil {
		t.Fatalf("joiner got %v", err)
	}
	if _, ok := c.Get("ns/cp", "a"); !ok {
		t.Fatal("retried poll did not apply")
	}
}

func TestRefreshWaitRespectsContext(t *testing.T) {
	src := newFakeSource("ns/cp")
	c, _, _ := newPolledCache(t, src)
	gate := make(chan struct{})
	defer close(gate)
	src.setBlock(gate)
	go func() { _ = c.Refresh(context.Background()) }()
	<-src.entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Refresh(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want deadline exceeded", err)
	}
}

func TestRefreshWithoutSources(t *testing.T) {
	c, _ := newTestCache(t, Options{})
	if err := c.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh without Sources succeeded")
	}
	// Run without Sources only waits for its context.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	cancel()
	<-done
}

func TestListErrorKeepsState(t *testing.T) {
	good := newFakeSource("ns1/cp", obj("ns1", "a", nil))
	bad := newFakeSource("ns2/cp", obj("ns2", "b", nil))
	c, _, _ := newPolledCache(t, good, bad)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	before := c.LastReplaced("ns2/cp")

	boom := errors.New("coderd unavailable")
	bad.fail(boom)
	good.set(obj("ns1", "a", nil), obj("ns1", "c", nil))
	err := c.Refresh(context.Background())
	var be *BackendErrors
	if !errors.As(err, &be) || len(be.Errs) != 1 || be.Errs["ns2/cp"] == nil {
		t.Fatalf("err = %v; want BackendErrors for ns2/cp", err)
	}
	if !errors.Is(err, boom) {
		t.Fatalf("err %v does not wrap the List error", err)
	}
	// The failing backend keeps its objects; the healthy one updates.
	if _, ok := c.Get("ns2/cp", "b"); !ok {
		t.Fatal("failed List removed objects")
	}
	if !c.Synced("ns2/cp") || !c.LastReplaced("ns2/cp").Equal(before) {
		t.Fatal("failed List changed sync state")
	}
	equalStrings(t, nextEvents(t, w, 1), []string{"ADDED ns1/c"})
	expectNoEvent(t, w)
}

func TestSourcesErrorDropsNothing(t *testing.T) {
	src := newFakeSource("ns/cp", obj("ns", "a", nil))
	c, _, fs := newPolledCache(t, src)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	fs.fail(errors.New("apiserver down"))
	if err := c.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh succeeded despite Sources failing")
	}
	if _, ok := c.Get("ns/cp", "a"); !ok {
		t.Fatal("Sources failure dropped a backend")
	}
}

func TestSourceDisappearingDropsBackend(t *testing.T) {
	a := newFakeSource("ns1/cp", obj("ns1", "a", nil))
	b := newFakeSource("ns2/cp", obj("ns2", "x", nil), obj("ns2", "y", nil))
	c, _, fs := newPolledCache(t, a, b)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	fs.set(a)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	equalStrings(t, nextEvents(t, w, 2), []string{"DELETED ns2/x", "DELETED ns2/y"})
	if c.Synced("ns2/cp") {
		t.Fatal("dropped backend still synced")
	}
	if n := c.Stats().Objects; n != 1 {
		t.Fatalf("objects = %d", n)
	}
}

func TestPollDoesNotRevertConcurrentWrites(t *testing.T) {
	src := newFakeSource("ns/cp", obj("ns", "a", nil), obj("ns", "b", nil))
	c, _, _ := newPolledCache(t, src)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-src.entered // consume the first poll's signal
	gate := make(chan struct{})
	src.setBlock(gate)
	done := make(chan error, 1)
	go func() { done <- c.Refresh(context.Background()) }()
	<-src.entered
	// Writes through this server land while the List is in flight; the
	// List's (older) answer must not undo them.
	c.Upsert("ns/cp", obj("ns", "new", nil), obj("ns", "a", map[string]string{"v": "2"}))
	c.Delete("ns/cp", "b")
	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	expectNoEvent(t, w)
	if _, ok := c.Get("ns/cp", "new"); !ok {
		t.Fatal("poll removed an object created during its List")
	}
	if got, _ := c.Get("ns/cp", "a"); got.GetLabels()["v"] != "2" {
		t.Fatal("poll reverted an update made during its List")
	}
	if _, ok := c.Get("ns/cp", "b"); ok {
		t.Fatal("poll resurrected an object deleted during its List")
	}

	// The next poll is authoritative again.
	src.setBlock(nil)
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := nextEvents(t, w, 3)
	equalStrings(t, got, []string{"MODIFIED ns/a", "ADDED ns/b", "DELETED ns/new"})
}

func TestRunStopsAndReleasesGoroutines(t *testing.T) {
	baseline := runtime.NumGoroutine()
	src := newFakeSource("ns/cp", obj("ns", "a", nil))
	fs := &fakeSources{}
	fs.set(src)
	c, fc := newTestCache(t, Options{Sources: fs.list, Interval: interval, BookmarkInterval: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()

	wctx, wcancel := context.WithCancel(context.Background())
	var ws []watch.Interface
	for range 5 {
		w, err := c.Watch(wctx, WatchOptions{AllowBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	waitFor(t, "poll", func() bool { return polls(c) == 1 })
	fc.Step(time.Minute) // bookmarks pending, nobody reading
	ws[0].Stop()
	ws[1].Stop()
	wcancel()
	for _, w := range ws {
		expectClosed(t, w)
	}
	cancel()
	<-done
	checkGoroutines(t, baseline)
}
