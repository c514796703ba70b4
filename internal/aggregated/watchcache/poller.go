package watchcache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/coder/coder-k8s/internal/metrics"
)

// flight is one poll; concurrent callers share it.
type flight struct {
	gen  uint64
	done chan struct{}
	err  error
	// waiters counts callers waiting on this flight; for tests.
	waiters int
	// leaderGone means the poll ended because its runner's context did, so
	// its result says nothing to callers whose context is still alive.
	leaderGone bool
}

// Run is the poller loop; start it once. It polls every Interval while at
// least one watcher is active, does not poll while none is, and polls
// promptly when the first watcher arrives. It returns when ctx ends.
//
// A poll Replaces every backend whose List succeeded, keeps the state of
// those whose List failed, and Drops every stored backend that Sources no
// longer returns (also ones fed only through Upsert) when Sources succeeded.
func (c *Cache) Run(ctx context.Context) {
	// The cache's gauges are exported while its poller runs.
	defer metrics.RegisterPoller(c.kind, c.pollerState)()
	if c.sources == nil {
		<-ctx.Done()
		return
	}
	for {
		if c.watcherCount() == 0 {
			c.setPolling(false)
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
				continue
			}
		}
		// A wake token left over from before this poll would only cause a
		// redundant poll.
		select {
		case <-c.wake:
		default:
		}
		c.setPolling(true)
		// Failures are logged by poll and leave state unchanged.
		_ = c.refresh(ctx, false)

		timer := c.clock.NewTimer(c.interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		case <-c.wake:
			// The watchers all left and one came back during the wait:
			// poll now rather than up to an interval later.
			timer.Stop()
		}
	}
}

func (c *Cache) watcherCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.watchers)
}

// Refresh polls every backend and returns once a poll that started after
// the call has completed, so the cache then reflects every backend as of at
// least the call (except backends whose List failed, reported as
// *BackendErrors). Concurrent callers and the Run loop share polls: at most
// one poll runs at a time, and all callers arriving while one runs share the
// single poll that follows it.
func (c *Cache) Refresh(ctx context.Context) error {
	if c.sources == nil {
		return errors.New("watchcache: Refresh needs Options.Sources")
	}
	return c.refresh(ctx, true)
}

// refresh runs or joins a poll. With fresh, only a poll that starts after
// this call counts; otherwise any running poll does (the loop only needs
// regular polls).
func (c *Cache) refresh(ctx context.Context, fresh bool) error {
	c.pollMu.Lock()
	var minGen uint64
	if fresh {
		minGen = c.pollGen + 1
	}
	for {
		f := c.pollFlight
		if f == nil {
			c.pollGen++
			f = &flight{gen: c.pollGen, done: make(chan struct{})}
			c.pollFlight = f
			c.pollMu.Unlock()

			f.err = c.poll(ctx)
			f.leaderGone = ctx.Err() != nil

			c.pollMu.Lock()
			c.pollFlight = nil
			c.pollMu.Unlock()
			close(f.done)
			return f.err
		}

		f.waiters++
		c.pollMu.Unlock()
		var waitErr error
		select {
		case <-f.done:
		case <-ctx.Done():
			waitErr = ctx.Err()
		}
		c.pollMu.Lock()
		f.waiters--
		if waitErr != nil {
			c.pollMu.Unlock()
			return fmt.Errorf("waiting for poll: %w", waitErr)
		}
		if f.gen >= minGen && !f.leaderGone {
			c.pollMu.Unlock()
			return f.err
		}
		// The poll started before this call, or ended with its runner's
		// context: run or join the next one.
	}
}

type listResult struct {
	key string
	// listedAfter is the cache seq before List started; see replaceLocked.
	listedAfter uint64
	at          time.Time
	objs        []prepared
	err         error
}

// poll lists every source once and applies the results.
func (c *Cache) poll(ctx context.Context) error {
	defer c.polls.Add(1)

	srcs, err := c.sources(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(err, "listing backends failed; keeping all state")
		}
		return fmt.Errorf("listing backends: %w", err)
	}
	// Keep the first source of each key; a duplicate would double the load.
	keys := make(map[string]bool, len(srcs))
	unique := srcs[:0:0]
	for _, s := range srcs {
		if s == nil || keys[s.Key()] {
			continue
		}
		keys[s.Key()] = true
		unique = append(unique, s)
	}
	c.mu.Lock()
	c.polledKeys = keys
	c.mu.Unlock()

	results := c.listAll(ctx, unique)

	var failed map[string]error
	for _, r := range results {
		if r.err != nil {
			if ctx.Err() == nil {
				c.log.Error(r.err, "listing backend failed; keeping its last known state", "backend", r.key)
				metrics.PollerRefreshFailed(controlPlaneLabel(r.key), c.kind)
			}
			if failed == nil {
				failed = map[string]error{}
			}
			failed[r.key] = r.err
			continue
		}
		c.mu.Lock()
		c.replaceLocked(r.key, r.objs, r.listedAfter, r.at, false)
		c.mu.Unlock()
	}

	c.mu.Lock()
	var gone []string
	for key := range c.backends {
		if !keys[key] {
			gone = append(gone, key)
		}
	}
	for _, key := range gone {
		c.dropLocked(key)
	}
	c.mu.Unlock()

	if failed != nil {
		return &BackendErrors{Errs: failed}
	}
	return nil
}

// listAll lists the sources with at most listConcurrency in flight.
func (c *Cache) listAll(ctx context.Context, srcs []Source) []listResult {
	results := make([]listResult, len(srcs))
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(c.listConcurrency, len(srcs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				results[i] = c.listOne(ctx, srcs[i])
			}
		}()
	}
	for i := range srcs {
		work <- i
	}
	close(work)
	wg.Wait()
	return results
}

func (c *Cache) listOne(ctx context.Context, s Source) listResult {
	r := listResult{key: s.Key()}
	c.mu.Lock()
	r.listedAfter = c.lastSeq
	c.mu.Unlock()
	r.at = c.clock.Now()
	objs, err := s.List(ctx)
	if err != nil {
		r.err = fmt.Errorf("listing backend %q: %w", r.key, err)
		return r
	}
	// Fingerprinting here runs it in parallel and outside the cache lock.
	r.objs = c.prepare(r.key, objs)
	return r
}

// setPolling records whether the poller polls (someone watches): lag is
// reported only then, and counted at most from when polling started.
func (c *Cache) setPolling(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !on:
		c.pollingSince = time.Time{}
	case c.pollingSince.IsZero():
		c.pollingSince = c.clock.Now()
	}
}

// pollerState is the cache's state for the poller gauges: objects per
// backend, and while polling, how old each polled backend's state is.
func (c *Cache) pollerState() metrics.PollerState {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := metrics.PollerState{Watchers: len(c.watchers)}
	byKey := map[string]*metrics.PollerBackend{}
	entry := func(key string) *metrics.PollerBackend {
		if b, ok := byKey[key]; ok {
			return b
		}
		b := &metrics.PollerBackend{ControlPlane: controlPlaneLabel(key)}
		byKey[key] = b
		return b
	}
	for key, b := range c.backends {
		entry(key).Objects = len(b.objs)
	}
	if !c.pollingSince.IsZero() {
		for key := range c.polledKeys {
			since := c.pollingSince
			if b := c.backends[key]; b != nil && b.lastReplaced.After(since) {
				since = b.lastReplaced
			}
			e := entry(key)
			e.Polled, e.Lag = true, max(now.Sub(since), 0)
		}
	}
	for _, b := range byKey {
		st.Backends = append(st.Backends, *b)
	}
	return st
}

// controlPlaneLabel is the control_plane label of a backend key: keys are
// "<namespace>/<control plane>" (backend.Backend.Key), and the static
// backend, which has no control plane, is "<namespace>/".
func controlPlaneLabel(key string) string {
	if strings.HasSuffix(key, "/") {
		return metrics.StaticControlPlane
	}
	return key
}
