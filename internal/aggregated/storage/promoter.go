package storage

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"k8s.io/client-go/util/workqueue"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// The promoter finishes templates' background builds: for every record
// with a build still running it polls the version in Coder (on the
// templateBuildWait schedule) and, once the import succeeded, makes it
// the template's active version and clears the build; a failed import is
// recorded (Failed, Coder's error, the end of the log) and the active
// version stays; a build still running past templateBuildWait.timeout,
// or whose coderd has not answered since before then, is canceled (best
// effort) and recorded as failed (promoter_check.go). Once a build has
// ended, it reads the template again so open watches see the outcome.
//
// It is a controller: a client-go rate-limited work queue of record keys
// (named promoterQueueName in the workqueue metrics), fed by the records
// informer's events. Working on a key reads the record: a running build
// is checked and, while it runs, requeued after InitialPollInterval until
// BackoffAfter into the build, then with the queue's per-item exponential
// backoff up to MaxPollInterval. A plain queue rather than a
// controller-runtime controller because the aggregated-apiserver mode has
// no manager, and because checks are bounded per backend rather than by a
// fixed pool of workers: each backend (a control plane's coderd) gets at
// most coderapi.MaxParallel checks at once, and only its own builds wait
// for its slots, so a coderd that hangs holds up no other coderd's builds.
//
// Every replica runs it; there is no leader. The build lives only in the
// record, so a restart or another replica carries on where one stopped
// (the informer's initial list queues every record). Replicas claim each
// outcome through the record's optimistic concurrency: the write that
// ends a build names the resourceVersion it read, so exactly one replica
// records it and the others find the build gone on their next look.
// Promotion itself is idempotent (make version V active, then read the
// template back to check it is), so a replica that dies between promoting
// and clearing the build leaves work that the next check repeats
// harmlessly: each build is promoted once and yields exactly one new
// active version.

// promoterMaxCheck bounds the coderd calls of one build check.
const promoterMaxCheck = 30 * time.Second

// promoterDefaultInterval is the initial poll interval when none is
// configured.
const promoterDefaultInterval = 2 * time.Second

// promoterQueueName names the promoter's work queue in the workqueue_*
// metrics.
const promoterQueueName = "codertemplate-builds"

// backendOfKey is the key of the backend whose coderd holds k's object.
func backendOfKey(k records.Key) string { return k.Namespace + "/" + k.ControlPlane }

// promoter runs the checks of one TemplateStorage.
type promoter struct {
	s     *TemplateStorage
	wait  templatesource.WaitConfig
	queue workqueue.TypedRateLimitingInterface[records.Key]
	// backoff is queue's rate limiter, read for the pauses of builds
	// past BackoffAfter.
	backoff workqueue.TypedRateLimiter[records.Key]
	slots   *backendSlots
	// checking runs the checks taken from the queue.
	checking sync.WaitGroup

	mu sync.Mutex
	// failing holds, per backend whose last poll failed, when the first
	// poll of that streak of failures began.
	failing map[string]time.Time
}

func newPromoter(s *TemplateStorage) *promoter {
	p := &promoter{s: s, wait: s.opts.BuildWait, failing: map[string]time.Time{},
		slots: &backendSlots{limit: coderapi.MaxParallel, sems: map[string]*backendSem{}}}
	if p.wait.InitialPollInterval <= 0 {
		p.wait.InitialPollInterval = promoterDefaultInterval
	}
	// Past BackoffAfter the pause doubles on each check from twice the
	// initial interval (the first doubling) up to the maximum, which is
	// never below the initial interval.
	p.backoff = workqueue.NewTypedItemExponentialFailureRateLimiter[records.Key](
		2*p.wait.InitialPollInterval, max(p.wait.MaxPollInterval, p.wait.InitialPollInterval))
	p.queue = workqueue.NewTypedRateLimitingQueueWithConfig(p.backoff,
		workqueue.TypedRateLimitingQueueConfig[records.Key]{Name: promoterQueueName})
	return p
}

// runPromoter runs the promoter until ctx ends, and returns once its
// goroutines have stopped.
func (s *TemplateStorage) runPromoter(ctx context.Context) {
	if s.records.store == nil {
		return
	}
	p := newPromoter(s)
	dispatched := make(chan struct{})
	go func() {
		defer close(dispatched)
		p.dispatch(ctx)
	}()
	defer func() {
		// Checks see ctx ended and return; what they would requeue is
		// dropped by the shut-down queue.
		p.queue.ShutDown()
		<-dispatched
		p.checking.Wait()
	}()
	p.watchRecords(ctx)
	<-ctx.Done()
}

// watchRecords queues the key of every template record with a build
// running, or whose build's end the watch cache does not show yet, as
// the records informer sees it added or changed. Registering fails only
// when the informer cannot be had; it is retried until ctx ends, as no
// build is found without it.
func (p *promoter) watchRecords(ctx context.Context) {
	for {
		err := p.s.records.store.OnChange(ctx, func(r *records.Record, deleted bool) {
			if deleted || r.Spec.Resource != coderv1alpha1.RecordResourceTemplates {
				return
			}
			if b := r.Spec.Build; (b != nil && !b.Failed) || p.s.buildShownStale(r) {
				p.queue.Add(records.KeyOf(r))
			}
		})
		if err == nil {
			return
		}
		p.s.log.Error(err, "template build promoter: no record events; retrying")
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.wait.InitialPollInterval):
		}
	}
}

// dispatch starts a check for each key the queue hands out, until the
// queue shuts down. Each check waits for one of its backend's slots.
func (p *promoter) dispatch(ctx context.Context) {
	for {
		key, shutdown := p.queue.Get()
		if shutdown {
			return
		}
		p.checking.Go(func() {
			defer p.queue.Done(key)
			release, ok := p.slots.acquire(ctx, backendOfKey(key))
			if !ok {
				return
			}
			defer release()
			p.process(ctx, key)
		})
	}
}

// process works on one record: it checks its running build and requeues
// it while it runs, or reads the template again once its build ended.
func (p *promoter) process(ctx context.Context, key records.Key) {
	if ctx.Err() != nil {
		return
	}
	s := p.s
	rec, err := s.records.get(ctx, key)
	if err != nil {
		s.log.Error(err, "template build promoter: read the record", "namespace", key.Namespace, "template", key.CoderID)
		p.queue.AddRateLimited(key)
		return
	}
	if rec == nil {
		p.queue.Forget(key)
		return
	}
	b := rec.Spec.Build
	if b == nil || b.Failed {
		// The build ended, here or on another replica: show its outcome
		// if the watch cache does not yet.
		p.queue.Forget(key)
		if s.buildShownStale(rec) {
			if t, ok := s.backendOf(ctx, key); ok {
				s.refreshBuild(ctx, t, key)
			}
		}
		return
	}
	t, ok := s.backendOf(ctx, key)
	if !ok {
		// Not served now (its control plane not ready, say): look again
		// later. A streak of failed polls does not outlive its serving.
		p.pollAnswered(backendOfKey(key))
		p.queue.AddAfter(key, p.pause(key, b.StartedAt.Time))
		return
	}
	if p.checkBuild(ctx, t, key, rec) {
		p.queue.Forget(key)
		return
	}
	if ctx.Err() != nil {
		return
	}
	p.queue.AddAfter(key, p.pause(key, b.StartedAt.Time))
}

// pause is how long key's build, started at started, waits before its
// next check, as templateBuildWait says: InitialPollInterval until
// BackoffAfter into the build, then the queue's exponential backoff.
func (p *promoter) pause(key records.Key, started time.Time) time.Duration {
	if time.Since(started) < p.wait.BackoffAfter {
		// The backoff starts from its first step once BackoffAfter passes.
		p.queue.Forget(key)
		return p.wait.InitialPollInterval
	}
	return p.backoff.When(key)
}

// pollFailed notes that a poll of backend that began at failed, and
// returns when the first poll of its current streak of failures began.
func (p *promoter) pollFailed(backend string, at time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	since, ok := p.failing[backend]
	if !ok || at.Before(since) {
		p.failing[backend] = at
		return at
	}
	return since
}

// pollAnswered notes that a poll of backend got the version: the streak
// of failures, if any, ended.
func (p *promoter) pollAnswered(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.failing, backend)
}

// backendSlots lets at most limit checks of one backend run at once;
// the checks waiting for a backend's slot get them in arrival order.
type backendSlots struct {
	limit int64

	mu   sync.Mutex
	sems map[string]*backendSem
}

// backendSem is one backend's slots and the number of checks holding or
// waiting for one, so that an idle backend's entry is dropped.
type backendSem struct {
	sem   *semaphore.Weighted
	users int
}

// acquire waits for one of backend's slots; ok is false when ctx ended
// first. release gives the slot back.
func (b *backendSlots) acquire(ctx context.Context, backend string) (release func(), ok bool) {
	b.mu.Lock()
	bs := b.sems[backend]
	if bs == nil {
		bs = &backendSem{sem: semaphore.NewWeighted(b.limit)}
		b.sems[backend] = bs
	}
	bs.users++
	b.mu.Unlock()
	leave := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if bs.users--; bs.users == 0 {
			delete(b.sems, backend)
		}
	}
	if err := bs.sem.Acquire(ctx, 1); err != nil {
		leave()
		return nil, false
	}
	return func() { bs.sem.Release(1); leave() }, true
}

// backendOf finds the backend of a record's Coder object among those
// served now.
func (s *TemplateStorage) backendOf(ctx context.Context, k records.Key) (target, bool) {
	ts, err := s.targets(ctx, k.Namespace)
	if err != nil {
		return target{}, false
	}
	for _, t := range ts {
		if t.ControlPlane == k.ControlPlane {
			return t, true
		}
	}
	return target{}, false
}
