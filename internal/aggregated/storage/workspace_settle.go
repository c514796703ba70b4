package storage

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// A workspace in transition (condition Reconciling: a build runs, or its
// agents are connecting or running their startup scripts) changes within
// seconds and someone is usually waiting for it (kubectl wait
// --for=condition=Ready). The poller lists every workspace only each
// watch poll interval (5 s by default), which would add half an interval
// on average to that wait; so while someone watches, each workspace in
// transition is read from coderd on its own every settleInterval. This
// costs coderd one GET per workspace in transition, not a list of every
// workspace, and stops once the workspace has settled.

const (
	// settleInterval is how often a workspace in transition is read
	// again (never less often than the poll interval).
	settleInterval = 500 * time.Millisecond
	// settleMax bounds the workspaces of one coderd read per round; the
	// others wait for the next poll as before.
	settleMax = 50
)

// Run polls coderd for the watch cache and reads workspaces in transition
// more often (runSettle) until ctx ends.
func (s *WorkspaceStorage) Run(ctx context.Context) {
	var settle sync.WaitGroup
	settle.Go(func() { s.runSettle(ctx) })
	s.genericStore.Run(ctx)
	settle.Wait()
}

// runSettle reads the workspaces in transition every settleInterval while
// someone watches. Each coderd is read in its own goroutine, and one whose
// previous round is still running is skipped, so a slow coderd delays
// only its own workspaces.
func (s *WorkspaceStorage) runSettle(ctx context.Context) {
	every := min(settleInterval, s.interval)
	if every <= 0 {
		every = settleInterval
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var rounds sync.WaitGroup
	defer rounds.Wait()
	var busy sync.Map
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if s.cache.Stats().Watchers == 0 {
			continue
		}
		ts, err := s.targets(ctx, "")
		if err != nil {
			continue
		}
		for _, t := range ts {
			key := t.Key()
			if _, running := busy.LoadOrStore(key, true); running {
				continue
			}
			rounds.Go(func() {
				defer busy.Delete(key)
				s.settleBackend(ctx, t)
			})
		}
	}
}

// settleBackend reads again, as the poller does (the operator), each
// workspace of t that is in transition, up to settleMax, and records what
// it reads in the cache (a workspace gone from coderd is deleted from
// it). It stops at the first failure: the next poll reports it.
func (s *WorkspaceStorage) settleBackend(ctx context.Context, t target) {
	key := t.Key()
	settling := s.cache.Select(key, func(o watchcache.Object) bool {
		w, ok := o.(*aggv1.CoderWorkspace)
		return ok && meta.IsStatusConditionPresentAndEqual(w.Status.Conditions, aggv1.ConditionReconciling, metav1.ConditionTrue)
	})
	for i, o := range settling {
		if i == settleMax {
			return
		}
		w := o.(*aggv1.CoderWorkspace)
		name, err := parseWorkspaceName(w.Name)
		if err != nil {
			continue
		}
		if _, err := s.read(ctx, t, name, w.Name); err != nil {
			if ctx.Err() == nil {
				s.log.V(1).Info("reading a workspace in transition failed; the next poll reads it", "backend", key, "workspace", w.Name, "error", err.Error())
			}
			return
		}
	}
}
