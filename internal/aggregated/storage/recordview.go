package storage

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/coder/coder-k8s/internal/aggregated/records"
)

// The records as this server reads them: its own writes visible at once,
// and the background upkeep of records (see metadata.go).

// recordJob is background upkeep of one record: count a spec change made
// in Coder (specHash), or delete a record whose object is gone. rv is the
// record's version the job was decided on; a record changed since is left
// alone (whoever changed it decided with newer facts), which also keeps
// several replicas from writing the same change twice.
type recordJob struct {
	key      records.Key
	rv       string
	specHash string
	gone     bool
}

// recordView reads records with this server's own writes visible at once
// (the informer sees them a little later), and runs the records' upkeep.
type recordView struct {
	store *records.Store
	log   logr.Logger

	mu sync.Mutex
	// recent holds records this server saved (or deleted) that the
	// informer may not show yet.
	recent map[records.Key]recentWrite
	// queued are the keys with upkeep queued, so that every poll does
	// not queue them again.
	queued map[records.Key]bool
	jobs   chan recordJob
}

type recentWrite struct {
	rec     *records.Record
	rv      uint64
	deleted bool
	at      time.Time
}

// recentFor is how long an own write is preferred over what the informer
// shows; the informer normally catches up within milliseconds.
const recentFor = 30 * time.Second

func newRecordView(s *records.Store, r *genericStore) *recordView {
	return &recordView{store: s, log: r.log, recent: map[records.Key]recentWrite{}, queued: map[records.Key]bool{}, jobs: make(chan recordJob, 1024)}
}

var errNoRecords = errors.New("no records store is configured: Kubernetes metadata cannot be kept")

func rvNumber(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}

// overlay picks between the informer's record and a recent own write.
func (v *recordView) overlay(k records.Key, rec *records.Record) *records.Record {
	v.mu.Lock()
	defer v.mu.Unlock()
	w, ok := v.recent[k]
	if !ok {
		return rec
	}
	switch {
	case time.Since(w.at) > recentFor,
		w.deleted && (rec == nil || rvNumber(rec.ResourceVersion) > w.rv),
		!w.deleted && rec != nil && rvNumber(rec.ResourceVersion) >= w.rv:
		delete(v.recent, k)
		return rec
	case w.deleted:
		return nil
	}
	return w.rec.DeepCopy()
}

// get returns k's record (a copy the caller owns), nil when none.
func (v *recordView) get(ctx context.Context, k records.Key) (*records.Record, error) {
	if v.store == nil {
		return nil, nil
	}
	rec, err := v.store.Get(ctx, k)
	if err != nil {
		return nil, err
	}
	return v.overlay(k, rec), nil
}

// list returns the records of one backend's resource by Coder ID.
func (v *recordView) list(ctx context.Context, namespace, resource, controlPlane string) (map[string]*records.Record, error) {
	if v.store == nil {
		return nil, nil
	}
	l, err := v.store.List(ctx, namespace, resource, controlPlane)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*records.Record, len(l))
	for i := range l {
		out[l[i].Spec.CoderID] = &l[i]
	}
	v.mu.Lock()
	var own []records.Key
	for k := range v.recent {
		if k.Namespace == namespace && k.Resource == resource && k.ControlPlane == controlPlane {
			own = append(own, k)
		}
	}
	v.mu.Unlock()
	for _, k := range own {
		if rec := v.overlay(k, out[k.CoderID]); rec != nil {
			out[k.CoderID] = rec
		} else {
			delete(out, k.CoderID)
		}
	}
	return out, nil
}

// save saves rec under k and remembers it until the informer has it.
func (v *recordView) save(ctx context.Context, rec *records.Record, k records.Key) error {
	if v.store == nil {
		return errNoRecords
	}
	if err := v.store.Save(ctx, rec, k); err != nil {
		return err
	}
	v.remember(k, recentWrite{rec: rec.DeepCopy(), rv: rvNumber(rec.ResourceVersion), at: time.Now()})
	return nil
}

// remember keeps an own write, and forgets those old enough for the
// informer to show them (keys never read again would stay otherwise).
func (v *recordView) remember(k records.Key, w recentWrite) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for key, old := range v.recent {
		if time.Since(old.at) > recentFor {
			delete(v.recent, key)
		}
	}
	v.recent[k] = w
}

// delete deletes rec (still at its version) and remembers that.
func (v *recordView) delete(ctx context.Context, rec *records.Record, k records.Key) error {
	if v.store == nil {
		return nil
	}
	if err := v.store.Delete(ctx, rec); err != nil {
		return err
	}
	v.remember(k, recentWrite{rv: rvNumber(rec.ResourceVersion), deleted: true, at: time.Now()})
	return nil
}

// waitNewer waits briefly until k's record is no longer at version stale
// (the informer delivers another writer's change within milliseconds). A
// record another writer deleted meanwhile is answered as nil.
func (v *recordView) waitNewer(ctx context.Context, k records.Key, stale string) (*records.Record, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		rec, err := v.get(ctx, k)
		if err != nil {
			return nil, err
		}
		if (rec == nil && stale != "") || (rec != nil && rec.ResourceVersion != stale) {
			return rec, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("record %s did not change", k.Name())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// enqueue queues upkeep without blocking; a full queue drops the job (the
// next poll queues it again).
func (v *recordView) enqueue(j recordJob) {
	if v.store == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.queued[j.key] {
		return
	}
	select {
	case v.jobs <- j:
		v.queued[j.key] = true
	default:
	}
}

// run does the queued upkeep until ctx ends.
func (v *recordView) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-v.jobs:
			v.do(ctx, j)
			v.mu.Lock()
			delete(v.queued, j.key)
			v.mu.Unlock()
		}
	}
}

func (v *recordView) do(ctx context.Context, j recordJob) {
	rec, err := v.get(ctx, j.key)
	if err != nil || rec == nil || rec.ResourceVersion != j.rv {
		return
	}
	if j.gone {
		if err := v.delete(ctx, rec, j.key); err != nil {
			v.log.Error(err, "deleting the record of an object gone from Coder", "record", j.key.Name())
			return
		}
		v.log.Info("deleted the record of an object gone from Coder", "record", j.key.Name())
		return
	}
	rec.Spec.Generation++
	rec.Spec.SpecHash = j.specHash
	if err := v.save(ctx, rec, j.key); err != nil && !apierrors.IsConflict(err) {
		v.log.Error(err, "counting a spec change made in Coder", "record", j.key.Name())
	}
}
