package storage

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
)

// The write protocol of Kubernetes metadata: every write to a served
// object reads its record, lets Coder accept the change, then saves the
// record at most once (see metadata.go for what a record holds).

// write is one write request's view of an object's metadata: the backend,
// the record's key, the record as it was (nil when none) and the object
// as it was (nil for a create). Every write saves at most one record,
// through commit.
type write struct {
	r    *genericStore
	t    target
	key  records.Key
	prev *records.Record
	cur  object
}

// beginWrite reads the record of the object cur (read from coderd).
func (r *genericStore) beginWrite(ctx context.Context, t target, cur object) (*write, error) {
	w := &write{r: r, t: t, cur: cur, key: r.recordKey(t, string(cur.GetUID()))}
	prev, err := r.records.get(ctx, w.key)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	w.prev = prev
	return w, nil
}

// createWrite is a create's write: the key is known once Coder made the
// object (out).
func (r *genericStore) createWrite(t target, out object) *write {
	return &write{r: r, t: t, key: r.recordKey(t, string(out.GetUID()))}
}

func (r *genericStore) recordKey(t target, coderID string) records.Key {
	return records.Key{Namespace: t.Namespace, Resource: r.gr.Resource, ControlPlane: t.ControlPlane, CoderID: coderID}
}

// record is the record the write leaves: want's metadata (the request's
// object, with managedFields as the field manager computed them) and, of
// a template, its durations as written, the deletionTimestamp kept,
// mutate's changes (a template build, a deletion), and the generation
// counted from cur to out (the object as Coder has it after the write,
// shown with this record).
func (w *write) record(want, out object, mutate func(*records.Record)) *records.Record {
	rec := &records.Record{}
	if w.prev != nil {
		rec = w.prev.DeepCopy()
	}
	rec.Spec.Name = out.GetName()
	rec.Spec.Labels = nil
	for k, v := range want.GetLabels() {
		if !isDerivedLabel(k) {
			if rec.Spec.Labels == nil {
				rec.Spec.Labels = map[string]string{}
			}
			rec.Spec.Labels[k] = v
		}
	}
	rec.Spec.Annotations = maps.Clone(want.GetAnnotations())
	if len(rec.Spec.Annotations) == 0 {
		rec.Spec.Annotations = nil
	}
	rec.Spec.Finalizers = userFinalizers(want.GetFinalizers())
	rec.Spec.OwnerReferences = slices.Clone(want.GetOwnerReferences())
	rec.Spec.ManagedFields = slices.Clone(want.GetManagedFields())
	if tpl, ok := want.(*aggv1.CoderTemplate); ok {
		rec.Spec.Durations = writtenDurations(rec.Spec.Durations, &tpl.Spec)
	}
	if mutate != nil {
		mutate(rec)
	}
	hash := shownSpecHash(out, rec)
	switch {
	case w.cur == nil:
		rec.Spec.Generation = 1
	case specHashOf(w.cur) != hash:
		rec.Spec.Generation = max(w.cur.GetGeneration(), 1) + 1
	default:
		rec.Spec.Generation = max(w.cur.GetGeneration(), 1)
	}
	rec.Spec.SpecHash = hash
	return rec
}

// changes reports whether rec differs from what the object has now, so
// that a write which changes nothing writes nothing (no new
// resourceVersion, as in Kubernetes).
func (w *write) changes(rec *records.Record) bool {
	if w.prev == nil {
		// What an object without a record shows.
		implied := recordedMeta{Name: rec.Spec.Name, Generation: max(w.cur.GetGeneration(), 1), SpecHash: rec.Spec.SpecHash, ManagedFields: coderdOwnsStatus()}
		return !apiequality.Semantic.DeepEqual(implied, metaOf(rec)) || rec.Spec.Build != nil
	}
	return !apiequality.Semantic.DeepEqual(metaOf(w.prev), metaOf(rec)) || !apiequality.Semantic.DeepEqual(w.prev.Spec.Build, rec.Spec.Build)
}

// preview is what commit would return, without writing anything: the dry
// run's answer.
func (w *write) preview(want, out object, mutate func(*records.Record)) object {
	mergeRecord(out, w.record(want, out, mutate))
	return out
}

// commit saves the write's one record (unless nothing changed) and puts
// out (Coder's state after the write) merged with it into the watch
// cache, returning the stored object.
func (w *write) commit(ctx context.Context, want, out object, mutate func(*records.Record)) (object, error) {
	rec := w.record(want, out, mutate)
	if w.cur == nil || w.changes(rec) {
		if err := w.save(ctx, rec, func() *records.Record { return w.record(want, out, mutate) }); err != nil {
			return nil, err
		}
	}
	return w.publish(out, rec), nil
}

// save saves rec. When another writer (the poller counting a change made
// in Coder, another replica) changed the record since this request read
// it, the request's record is rebuilt on the newer one and saved again:
// Coder has already accepted the change.
func (w *write) save(ctx context.Context, rec *records.Record, rebuild func() *records.Record) error {
	for attempt := 0; ; attempt++ {
		err := w.r.records.save(ctx, rec, w.key)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 3 {
			return w.saveErr(err)
		}
		stale := ""
		if w.prev != nil {
			stale = w.prev.ResourceVersion
		}
		prev, gerr := w.r.records.waitNewer(ctx, w.key, stale)
		if gerr != nil || (prev == nil && stale != "") {
			// Another writer deleted the record: the object is being
			// deleted, which this write must not undo.
			return w.saveErr(err)
		}
		w.prev = prev
		rec = rebuild()
	}
}

func (w *write) saveErr(err error) error {
	if apierrors.IsConflict(err) {
		return apierrors.NewConflict(w.r.gr, w.key.Name(), fmt.Errorf("the change was made in Coder, but its Kubernetes metadata changed meanwhile; read the object and retry: %w", err))
	}
	return apierrors.NewInternalError(fmt.Errorf("the change was made in Coder, but saving its Kubernetes metadata failed: %w", err))
}

// publish merges out with rec and stores it in the watch cache.
func (w *write) publish(out object, rec *records.Record) object {
	mergeRecord(out, rec)
	return w.r.cache.Upsert(w.t.Key(), out)[0].(object)
}

// forget deletes the record after Coder deleted the object. The record is
// of no use without the object, so a record another writer (upkeep, a
// promoter, another replica) changed meanwhile is read again and deleted,
// and one another writer deleted after changing it is done with.
func (w *write) forget(ctx context.Context) error {
	for attempt := 0; w.prev != nil; attempt++ {
		err := w.r.records.delete(ctx, w.prev, w.key)
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 3 {
			return apierrors.NewInternalError(fmt.Errorf("the object was deleted in Coder, but deleting its Kubernetes metadata failed: %w", err))
		}
		prev, gerr := w.r.records.waitNewer(ctx, w.key, w.prev.ResourceVersion)
		if gerr != nil {
			return apierrors.NewInternalError(fmt.Errorf("the object was deleted in Coder, but deleting its Kubernetes metadata failed: %w", err))
		}
		w.prev = prev
	}
	return nil
}

// holdDelete is a delete of an object with finalizers: the record gets a
// deletionTimestamp and Coder is left alone until the finalizers are
// removed. cur is the live object; dryRun writes nothing.
func (w *write) holdDelete(ctx context.Context, dryRun bool) (object, error) {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	mark := func(r *records.Record) { r.Spec.DeletionTimestamp = &now }
	out := w.cur.DeepCopyObject().(object)
	want := w.cur.DeepCopyObject().(object)
	if dryRun {
		return w.preview(want, out, mark), nil
	}
	return w.commit(ctx, want, out, mark)
}
