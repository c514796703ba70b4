package watchcache

// One file (over 500 lines) for the poll loop, its single-flight refresh and
// the per-backend backoff, which share the flight and backoff state.

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
	// ready is closed once keys (or srcErr) is set.
	ready      chan struct{}
	keys       map[string]*keyResult
	srcErr     error
	srcCtxGone bool
}

// Run is the poller loop; start it once. It polls every Interval while at
// least one watcher is active, does not poll while none is, and polls
// promptly when the first watcher arrives. It returns when ctx ends, after
// the lists it started have ended.
//
// Each backend (one coderd) is listed on its own: a poll starts a List for
// every backend that has none in flight and is not backing off, and each
// result is applied (its events sent) as soon as it arrives. A slow or hung
// coderd therefore delays only its own objects; the next poll skips it
// while its List is still running. A List that succeeds Replaces the
// backend's objects; one that fails keeps them, except that the objects it
// did read (Source.List's partial result) are updated. Every poll Drops
// each stored backend that Sources no longer returns (also ones fed only
// through Upsert) when Sources succeeded.
//
// After a failed List the backend waits before its next one: at least the
// Retry-After coderd sent (an error with a RetryAfter() time.Duration
// method, such as coderapi.RetryAfterError), and from the second failure in
// a row Interval doubled per failure up to MaxBackoff.
func (c *Cache) Run(ctx context.Context) {
	// The cache's gauges are exported while its poller runs.
	defer metrics.RegisterPoller(c.kind, c.pollerState)()
	if c.sources == nil {
		<-ctx.Done()
		return
	}
	var lists sync.WaitGroup
	defer lists.Wait()
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
		c.pollDue(ctx, &lists)

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

// pollDue starts a List for every backend that has none in flight and is
// not backing off, without waiting for them; the poll counts as done (Stats)
// once the Lists it started have ended.
func (c *Cache) pollDue(ctx context.Context, lists *sync.WaitGroup) {
	srcs, err := c.currentSources(ctx)
	if err != nil {
		c.polls.Add(1)
		return
	}
	var round sync.WaitGroup
	now := c.clock.Now()
	c.listMu.Lock()
	for _, s := range srcs {
		key := s.Key()
		if c.lists[key] != nil || now.Before(c.backoffOf(key).until) {
			continue
		}
		l := c.startListLocked(ctx, s, lists)
		round.Add(1)
		go func() {
			defer round.Done()
			<-l.done
		}()
	}
	c.listMu.Unlock()
	lists.Add(1)
	go func() {
		defer lists.Done()
		round.Wait()
		c.polls.Add(1)
	}()
}

// Refresh lists every backend and returns once a List of each that started
// after the call has ended, so the cache then reflects every backend as of
// at least the call, except backends whose List failed or that are backing
// off after a failure (not listed, so coderd's Retry-After is honoured),
// reported as *BackendErrors. Each backend's result is applied as soon as
// it arrives, so a hung coderd delays only the Refresh calls that wait for
// it (RefreshBackends waits only for some). Concurrent callers and the Run
// loop share Lists: all callers arriving while a Refresh runs share the
// single one that follows it.
func (c *Cache) Refresh(ctx context.Context) error {
	return c.RefreshBackends(ctx, nil)
}

// RefreshBackends is Refresh waiting only for the backends match accepts
// (nil: all) and reporting only their failures. Every backend is still
// listed (the shared poll serves all callers).
func (c *Cache) RefreshBackends(ctx context.Context, match func(key string) bool) error {
	if c.sources == nil {
		return errors.New("watchcache: Refresh needs Options.Sources")
	}
	return c.refresh(ctx, true, match)
}

// refresh runs or joins a poll. With fresh, only a poll that starts after
// this call counts; otherwise any running poll does. It waits only for the
// backends match accepts (nil: all); the poll itself lists every backend
// and runs on (with this call's context) after a caller stops waiting.
func (c *Cache) refresh(ctx context.Context, fresh bool, match func(key string) bool) error {
	c.pollMu.Lock()
	var minGen uint64
	if fresh {
		minGen = c.pollGen + 1
	}
	for {
		f := c.pollFlight
		if f == nil {
			c.pollGen++
			f = &flight{gen: c.pollGen, done: make(chan struct{}), ready: make(chan struct{})}
			c.pollFlight = f
			go func() {
				f.err = c.poll(ctx, f)
				f.leaderGone = ctx.Err() != nil
				c.pollMu.Lock()
				c.pollFlight = nil
				c.pollMu.Unlock()
				close(f.done)
			}()
		}

		f.waiters++
		c.pollMu.Unlock()
		var err, waitErr error
		retry := false
		if f.gen >= minGen {
			err, retry, waitErr = f.wait(ctx, match)
		} else {
			select {
			case <-f.done:
				retry = true
			case <-ctx.Done():
				waitErr = ctx.Err()
			}
		}
		c.pollMu.Lock()
		f.waiters--
		if waitErr != nil {
			c.pollMu.Unlock()
			return fmt.Errorf("waiting for poll: %w", waitErr)
		}
		if !retry {
			c.pollMu.Unlock()
			return err
		}
		// The poll started before this call, or a List this call waits for
		// ended with its runner's context while ours lives: wait for that
		// poll to end, then run or join the next one.
		if c.pollFlight == f {
			c.pollMu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return fmt.Errorf("waiting for poll: %w", ctx.Err())
			}
			c.pollMu.Lock()
		}
	}
}

// keyResult is one backend's outcome within a poll.
type keyResult struct {
	done chan struct{}
	err  error
	// ctxGone means the List ended because the poll's context did.
	ctxGone bool
}

// wait waits for the results of the backends match accepts. retry means
// one of them ended with the poll runner's context, so it says nothing to
// this caller.
func (f *flight) wait(ctx context.Context, match func(key string) bool) (err error, retry bool, waitErr error) {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if f.srcErr != nil {
		return f.srcErr, f.srcCtxGone, nil
	}
	var failed map[string]error
	for key, r := range f.keys {
		if match != nil && !match(key) {
			continue
		}
		select {
		case <-r.done:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if r.ctxGone {
			retry = true
		}
		if r.err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[key] = r.err
		}
	}
	if failed != nil {
		return &BackendErrors{Errs: failed}, retry, nil
	}
	return nil, retry, nil
}

// backendList is one List of one backend, shared by every poll that needs
// it.
type backendList struct {
	// id orders Lists: a List with a higher id started later.
	id   uint64
	done chan struct{}
	err  error
	// ctxGone means the List ended because its starter's context did.
	ctxGone bool
}

// backoffState is a backend's failure streak.
type backoffState struct {
	failures int
	// until is when the backend may be listed again.
	until time.Time
	// retryAfter is what coderd asked for in its last failure, if anything.
	retryAfter time.Duration
	// since is when the streak's first failure happened.
	since time.Time
}

// backoffOf returns key's state; listMu held.
func (c *Cache) backoffOf(key string) *backoffState {
	b := c.backoffs[key]
	if b == nil {
		b = &backoffState{}
		c.backoffs[key] = b
	}
	return b
}

// BackoffError is the error of a backend not listed because it is backing
// off after a failure.
type BackoffError struct {
	Key   string
	Until time.Time
	// Last is the failure that started or extended the backoff.
	Last error
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("backend %q is backing off until %s after: %v", e.Key, e.Until.UTC().Format(time.RFC3339), e.Last)
}

func (e *BackoffError) Unwrap() error { return e.Last }

// currentSources lists the backends, keeps the first source of each key
// (a duplicate would double the load) and Drops every stored backend that
// is gone.
func (c *Cache) currentSources(ctx context.Context) ([]Source, error) {
	srcs, err := c.sources(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(err, "listing backends failed; keeping all state")
		}
		return nil, fmt.Errorf("listing backends: %w", err)
	}
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
	c.listMu.Lock()
	for key := range c.backoffs {
		if !keys[key] {
			delete(c.backoffs, key)
		}
	}
	c.listMu.Unlock()
	return unique, nil
}

// poll lists every source once with Lists started after it began, recording
// each backend's result in f as it arrives, and waits for them.
func (c *Cache) poll(ctx context.Context, f *flight) error {
	defer c.polls.Add(1)
	srcs, err := c.currentSources(ctx)
	if err != nil {
		f.srcErr, f.srcCtxGone = err, ctx.Err() != nil
		close(f.ready)
		return err
	}
	c.listMu.Lock()
	after := c.listSeq
	c.listMu.Unlock()

	f.keys = make(map[string]*keyResult, len(srcs))
	for _, s := range srcs {
		f.keys[s.Key()] = &keyResult{done: make(chan struct{})}
	}
	close(f.ready)
	var wg sync.WaitGroup
	for _, s := range srcs {
		r := f.keys[s.Key()]
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.err = c.listFresh(ctx, s, after)
			r.ctxGone = r.err != nil && ctx.Err() != nil
			close(r.done)
		}()
	}
	wg.Wait()
	var failed map[string]error
	for key, r := range f.keys {
		if r.err != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[key] = r.err
		}
	}
	if failed != nil {
		return &BackendErrors{Errs: failed}
	}
	return nil
}

// listFresh waits for a List of s that started after the List numbered
// after, starting one when none runs, and returns its error. A backend
// backing off is not listed: its error is a *BackoffError.
func (c *Cache) listFresh(ctx context.Context, s Source, after uint64) error {
	key := s.Key()
	for {
		c.listMu.Lock()
		l := c.lists[key]
		if l == nil {
			if b := c.backoffOf(key); c.clock.Now().Before(b.until) {
				c.listMu.Unlock()
				return &BackoffError{Key: key, Until: b.until, Last: c.lastErrs[key]}
			}
			l = c.startListLocked(ctx, s, nil)
		}
		c.listMu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for backend %q: %w", key, ctx.Err())
		}
		if l.id > after && !(l.ctxGone && ctx.Err() == nil) {
			return l.err
		}
		// That List started before this poll, or ended with its
		// starter's context while ours lives: list again.
	}
}

// startListLocked starts a List of s in its own goroutine, which applies
// the result as soon as it arrives. owner, if set, tracks the goroutine.
// listMu held.
func (c *Cache) startListLocked(ctx context.Context, s Source, owner *sync.WaitGroup) *backendList {
	c.listSeq++
	l := &backendList{id: c.listSeq, done: make(chan struct{})}
	key := s.Key()
	c.lists[key] = l
	if owner != nil {
		owner.Add(1)
	}
	go func() {
		if owner != nil {
			defer owner.Done()
		}
		l.err = c.listAndApply(ctx, s)
		l.ctxGone = l.err != nil && ctx.Err() != nil
		c.listMu.Lock()
		delete(c.lists, key)
		c.listMu.Unlock()
		close(l.done)
	}()
	return l
}

// listAndApply lists one backend (within ListConcurrency) and applies the
// result: a complete list Replaces, a partial one updates what it read.
func (c *Cache) listAndApply(ctx context.Context, s Source) error {
	key := s.Key()
	select {
	case c.listSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("listing backend %q: %w", key, ctx.Err())
	}
	c.mu.Lock()
	listedAfter := c.lastSeq
	c.mu.Unlock()
	at := c.clock.Now()
	objs, err := s.List(ctx)
	<-c.listSem
	var ps []prepared
	if len(objs) > 0 {
		// Fingerprinting here runs it in parallel and outside the cache
		// lock.
		ps = c.prepare(key, objs)
	}

	c.mu.Lock()
	current := c.polledKeys[key]
	switch {
	case !current:
		// Sources no longer returns the backend: nothing to apply.
	case err == nil:
		c.replaceLocked(key, ps, listedAfter, at, false)
	case len(ps) > 0:
		c.mergeLocked(key, ps, listedAfter)
	}
	c.mu.Unlock()

	if err == nil || errors.Is(err, ErrIncomplete) {
		c.listMu.Lock()
		delete(c.backoffs, key)
		delete(c.lastErrs, key)
		c.listMu.Unlock()
		if err != nil {
			c.log.V(1).Info("backend list was incomplete; updated what it read and kept the rest", "backend", key, "reason", err.Error())
		}
		return nil
	}
	err = fmt.Errorf("listing backend %q: %w", key, err)
	if ctx.Err() != nil {
		return err
	}
	c.backOff(key, err, len(ps))
	return err
}

// backOff records a failed List of key and logs it with the backoff.
func (c *Cache) backOff(key string, err error, kept int) {
	now := c.clock.Now()
	var ra interface{ RetryAfter() time.Duration }
	var retryAfter time.Duration
	if errors.As(err, &ra) {
		retryAfter = ra.RetryAfter()
	}
	c.listMu.Lock()
	b := c.backoffOf(key)
	if b.failures == 0 {
		b.since = now
	}
	b.failures++
	var wait time.Duration
	if b.failures > 1 {
		wait = c.interval
		for i := 1; i < b.failures && wait < c.maxBackoff; i++ {
			wait *= 2
		}
		wait = min(wait, c.maxBackoff)
	}
	wait = max(wait, retryAfter)
	b.until = now.Add(wait)
	b.retryAfter = retryAfter
	failures := b.failures
	c.lastErrs[key] = err
	c.listMu.Unlock()

	reason := "error"
	if retryAfter > 0 {
		reason = "retry_after"
	}
	metrics.PollerRefreshFailed(controlPlaneLabel(key), c.kind)
	if wait > 0 {
		metrics.PollerBackedOff(controlPlaneLabel(key), c.kind, reason)
	}
	c.log.Error(err, "listing backend failed; keeping its last known state",
		"backend", key, "updatedFromPartialList", kept, "failuresInARow", failures,
		"retryAfter", retryAfter.String(), "nextListNotBefore", wait.String())
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
	c.listMu.Lock()
	for key, b := range c.backoffs {
		if d := b.until.Sub(now); d > 0 {
			entry(key).Backoff = d
		}
	}
	c.listMu.Unlock()
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
