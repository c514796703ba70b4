package storage

import (
	"context"
	"sync"
	"time"

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
// effort) and recorded as failed (promoter_check.go).
//
// It is a controller: a client-go work queue of builds (named
// promoterQueueName in the workqueue metrics) whose rate limiter is the
// templateBuildWait schedule, fed by record events and a periodic resync
// of the records informer. Each backend (a control plane's coderd) gets
// at most coderapi.MaxParallel checks at once, and only its own builds
// wait for its slots, so a coderd that hangs holds up no other coderd's
// builds.
//
// Every replica runs it; there is no leader. The build lives only in the
// record, so a restart or another replica carries on where one stopped.
// Replicas claim each outcome through the record's optimistic
// concurrency: the write that ends a build names the resourceVersion it
// read, so exactly one replica records it and the others find the build
// gone on their next look. Promotion itself is idempotent (make version V
// active, then read the template back to check it is), so a replica that
// dies between promoting and clearing the build leaves work that the next
// check repeats harmlessly: each build is promoted once and yields exactly
// one new active version.

// promoterMaxCheck bounds the coderd calls of one build check.
const promoterMaxCheck = 30 * time.Second

// promoterDefaultInterval is the initial poll interval when none is
// configured.
const promoterDefaultInterval = 2 * time.Second

// promoterQueueName names the promoter's work queue in the workqueue_*
// metrics.
const promoterQueueName = "codertemplate-builds"

// buildItem is one piece of the promoter's work: a template's running
// build to check (versionID set), or a template whose shown build went
// stale to read again from Coder (versionID empty).
type buildItem struct {
	key       records.Key
	versionID string
}

// backend is the key of the backend whose coderd the item calls.
func (i buildItem) backend() string { return i.key.Namespace + "/" + i.key.ControlPlane }

// buildState is what the promoter remembers of a running build between
// checks.
type buildState struct {
	started time.Time
	// interval is the last pause between checks (0 before the first).
	interval time.Duration
	checks   int
}

// lane is one backend's share of the checks: how many run, and the items
// waiting for one of its slots.
type lane struct {
	running int
	waiting []buildItem
}

// promoter runs the checks of one TemplateStorage.
type promoter struct {
	s     *TemplateStorage
	wait  templatesource.WaitConfig
	queue workqueue.TypedRateLimitingInterface[buildItem]
	// limit is the most checks that run at once per backend.
	limit int
	// checking runs every lane's goroutines.
	checking sync.WaitGroup

	mu     sync.Mutex
	builds map[buildItem]*buildState
	lanes  map[string]*lane
	// failing holds, per backend whose last poll failed, when the first
	// poll of that streak of failures began.
	failing map[string]time.Time
}

func newPromoter(s *TemplateStorage) *promoter {
	p := &promoter{s: s, wait: s.opts.BuildWait, limit: coderapi.MaxParallel, builds: map[buildItem]*buildState{}, lanes: map[string]*lane{}, failing: map[string]time.Time{}}
	if p.wait.InitialPollInterval <= 0 {
		p.wait.InitialPollInterval = promoterDefaultInterval
	}
	p.queue = workqueue.NewTypedRateLimitingQueueWithConfig[buildItem](p,
		workqueue.TypedRateLimitingQueueConfig[buildItem]{Name: promoterQueueName})
	return p
}

// runPromoter runs the promoter until ctx ends. Builds are found by
// record events, and by a resync of the records informer every initial
// poll interval.
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

	if err := s.records.store.OnChange(ctx, func(r *records.Record, deleted bool) {
		if deleted || r.Spec.Resource != coderv1alpha1.RecordResourceTemplates {
			return
		}
		switch b := r.Spec.Build; {
		case b != nil && !b.Failed:
			p.track(buildItem{key: records.KeyOf(r), versionID: b.VersionID}, b.StartedAt.Time)
		case s.buildShownStale(r):
			p.queue.Add(buildItem{key: records.KeyOf(r)})
		}
	}); err != nil {
		// Builds are still found by the periodic resync.
		s.log.Error(err, "template build promoter: no record events")
	}
	ticker := time.NewTicker(p.wait.InitialPollInterval)
	defer ticker.Stop()
	for {
		p.resync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// track queues a running build the promoter does not know yet.
func (p *promoter) track(item buildItem, started time.Time) {
	p.mu.Lock()
	known := p.builds[item] != nil
	if !known {
		p.builds[item] = &buildState{started: started}
	}
	p.mu.Unlock()
	if !known {
		p.queue.Add(item)
	}
}

// resync queues every running build of a served backend that the
// promoter does not know yet and forgets the builds that ended. It reads
// only the records informer and the backends' cache, never coderd.
func (p *promoter) resync(ctx context.Context) {
	ts, err := p.s.targets(ctx, "")
	if err != nil {
		p.s.log.V(1).Info("template build promoter: no backends", "error", err.Error())
		return
	}
	running := map[buildItem]time.Time{}
	served, unread := map[string]bool{}, map[string]bool{}
	for _, t := range ts {
		served[t.Key()] = true
		recs, err := p.s.records.list(ctx, t.Namespace, coderv1alpha1.RecordResourceTemplates, t.ControlPlane)
		if err != nil {
			p.s.log.Error(err, "template build promoter: list records", "namespace", t.Namespace)
			unread[t.Key()] = true
			continue
		}
		for _, rec := range recs {
			if b := rec.Spec.Build; b != nil && !b.Failed {
				running[buildItem{key: records.KeyOf(rec), versionID: b.VersionID}] = b.StartedAt.Time
			}
		}
	}
	p.mu.Lock()
	for b := range p.failing {
		if !served[b] {
			delete(p.failing, b)
		}
	}
	for item := range p.builds {
		if _, ok := running[item]; !ok && !unread[item.backend()] {
			delete(p.builds, item)
		}
	}
	p.mu.Unlock()
	for item, started := range running {
		p.track(item, started)
	}
}

// dispatch hands the queue's items to their backends' lanes until the
// queue shuts down.
func (p *promoter) dispatch(ctx context.Context) {
	for {
		item, shutdown := p.queue.Get()
		if shutdown {
			return
		}
		p.mu.Lock()
		l := p.lanes[item.backend()]
		if l == nil {
			l = &lane{}
			p.lanes[item.backend()] = l
		}
		if l.running >= p.limit {
			l.waiting = append(l.waiting, item)
			p.mu.Unlock()
			continue
		}
		l.running++
		p.mu.Unlock()
		p.checking.Go(func() { p.runLane(ctx, item) })
	}
}

// runLane works on item, then on the items waiting in its backend's lane
// until there are none: one of the lane's slots.
func (p *promoter) runLane(ctx context.Context, item buildItem) {
	for {
		p.process(ctx, item)
		p.mu.Lock()
		l := p.lanes[item.backend()]
		if len(l.waiting) == 0 {
			if l.running--; l.running == 0 {
				delete(p.lanes, item.backend())
			}
			p.mu.Unlock()
			return
		}
		item = l.waiting[0]
		l.waiting[0] = buildItem{}
		l.waiting = l.waiting[1:]
		p.mu.Unlock()
	}
}

// process checks one build, or reads one template again, and requeues a
// build that is still running for its next check.
func (p *promoter) process(ctx context.Context, item buildItem) {
	defer p.queue.Done(item)
	t, ok := p.s.backendOf(ctx, item.key)
	if item.versionID == "" {
		p.queue.Forget(item)
		if ok {
			p.s.refreshBuild(ctx, t, item.key)
		}
		return
	}
	p.mu.Lock()
	st := p.builds[item]
	p.mu.Unlock()
	if st == nil {
		// Ended, or replaced by a newer build, since it was queued.
		p.queue.Forget(item)
		return
	}
	done := false
	if ok {
		done = p.checkBuild(ctx, t, item)
	}
	if ctx.Err() != nil {
		return
	}
	if done {
		p.mu.Lock()
		if p.builds[item] == st {
			delete(p.builds, item)
		}
		p.mu.Unlock()
		p.queue.Forget(item)
		return
	}
	p.queue.AddRateLimited(item)
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

// The promoter is its queue's rate limiter: the pause before a build's
// next check follows templateBuildWait (InitialPollInterval until
// BackoffAfter into the build, then doubling up to MaxPollInterval).
var _ workqueue.TypedRateLimiter[buildItem] = (*promoter)(nil)

// When is the pause before item's next check.
func (p *promoter) When(item buildItem) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.builds[item]
	if st == nil {
		return p.wait.NextInterval(0, 0)
	}
	st.interval = p.wait.NextInterval(time.Since(st.started), st.interval)
	st.checks++
	return st.interval
}

// NumRequeues is how many times item's check found it still running.
func (p *promoter) NumRequeues(item buildItem) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.builds[item]; st != nil {
		return st.checks
	}
	return 0
}

// Forget is a no-op: a build's schedule is forgotten with the build.
func (p *promoter) Forget(buildItem) {}
