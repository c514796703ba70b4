package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// Kubernetes metadata of the served objects. Coder keeps the spec and
// status; labels, annotations, finalizers, ownerReferences, managedFields,
// the generation and a finalizer-held deletionTimestamp live in one
// CoderObjectRecord per object (package records). An object's view is
// Coder's state merged with its record (mergeRecord), on every path that
// puts an object into the watch cache, so GET, LIST and WATCH all carry
// it. Writes save the record once, after Coder accepted the change.

var (
	labelsPath     = field.NewPath("metadata", "labels")
	finalizersPath = field.NewPath("metadata", "finalizers")
)

// derivedLabelKeys are the labels coder-k8s derives from Coder. They are
// never stored: the derived value wins, and a write may only repeat it.
var derivedLabelKeys = []string{aggv1.LabelOrganization, aggv1.LabelControlPlane, aggv1.LabelOwner, aggv1.LabelTemplate}

func isDerivedLabel(k string) bool { return slices.Contains(derivedLabelKeys, k) }

// cleanupGrace is how old a record must be before a list of its backend
// that lacks its Coder object deletes it: a record saved just after the
// list started may describe an object the list did not see yet, and the
// record's creationTimestamp (kube-apiserver's clock, in seconds) may be
// a little off ours.
var cleanupGrace = 5 * time.Second

// specHashOf identifies an object's spec, so that a spec change made in
// Coder counts as a generation too.
func specHashOf(o object) string {
	var spec any
	switch v := o.(type) {
	case *aggv1.CoderWorkspace:
		spec = &v.Spec
	case *aggv1.CoderTemplate:
		spec = &v.Spec
	}
	data, _ := json.Marshal(spec) // plain structs of strings, maps and numbers
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}

// setObservedGeneration says which generation the status (computed from
// Coder at read time, so always the current spec's) describes.
func setObservedGeneration(o object, gen int64) {
	var conds []metav1.Condition
	switch v := o.(type) {
	case *aggv1.CoderWorkspace:
		v.Status.ObservedGeneration = gen
		conds = v.Status.Conditions
	case *aggv1.CoderTemplate:
		v.Status.ObservedGeneration = gen
		conds = v.Status.Conditions
	}
	for i := range conds {
		conds[i].ObservedGeneration = gen
	}
}

// mergeRecord sets o's Kubernetes metadata from rec (nil: o has no
// record). o may already carry merged metadata: what Coder derives (the
// derived labels, a workspace's delete-build finalizer and its
// deletionTimestamp) is kept, everything else comes from rec, so merging
// again is harmless. It reports whether Coder's spec differs from the spec
// rec last counted (a change made in Coder, not yet counted in rec).
func mergeRecord(o object, rec *records.Record) (specChangedInCoder bool) {
	labels := map[string]string{}
	for k, v := range o.GetLabels() {
		if isDerivedLabel(k) {
			labels[k] = v
		}
	}
	coderDeleting := slices.Contains(o.GetFinalizers(), FinalizerDeleteBuild)
	var finalizers []string
	gen := int64(1)
	if rec == nil {
		o.SetAnnotations(nil)
		o.SetOwnerReferences(nil)
		o.SetManagedFields(coderdOwnsStatus())
		if !coderDeleting {
			o.SetDeletionTimestamp(nil)
		}
	} else {
		for k, v := range rec.Spec.Labels {
			if !isDerivedLabel(k) {
				labels[k] = v
			}
		}
		o.SetAnnotations(maps.Clone(rec.Spec.Annotations))
		for _, f := range rec.Spec.Finalizers {
			if f != FinalizerDeleteBuild {
				finalizers = append(finalizers, f)
			}
		}
		o.SetOwnerReferences(slices.Clone(rec.Spec.OwnerReferences))
		if len(rec.Spec.ManagedFields) > 0 {
			mf := make([]metav1.ManagedFieldsEntry, len(rec.Spec.ManagedFields))
			for i := range rec.Spec.ManagedFields {
				rec.Spec.ManagedFields[i].DeepCopyInto(&mf[i])
			}
			o.SetManagedFields(mf)
		} else {
			o.SetManagedFields(coderdOwnsStatus())
		}
		if !coderDeleting {
			o.SetDeletionTimestamp(rec.Spec.DeletionTimestamp.DeepCopy())
		}
		gen = max(rec.Spec.Generation, 1)
		if rec.Spec.SpecHash != "" && rec.Spec.SpecHash != specHashOf(o) {
			specChangedInCoder = true
			gen++
		}
	}
	if coderDeleting {
		finalizers = append(finalizers, FinalizerDeleteBuild)
	}
	o.SetLabels(labels)
	o.SetFinalizers(finalizers)
	o.SetGeneration(gen)
	setObservedGeneration(o, gen)
	return specChangedInCoder
}

// derivedLabels are the derived labels among an object's labels.
func derivedLabels(l map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		if isDerivedLabel(k) {
			out[k] = v
		}
	}
	return out
}

// validateMeta checks the metadata a write asks for: Kubernetes' own rules
// for each field, derived labels only at their derived value (derived are
// the object's), and no new finalizer on an object being deleted (cur nil
// for a create).
func validateMeta(want object, derived map[string]string, cur object) field.ErrorList {
	errs := metav1validation.ValidateLabels(want.GetLabels(), labelsPath)
	for _, k := range slices.Sorted(maps.Keys(want.GetLabels())) {
		if v := want.GetLabels()[k]; isDerivedLabel(k) && v != derived[k] {
			msg := "coder-k8s sets this label from Coder; it cannot be set"
			if d, ok := derived[k]; ok {
				msg = fmt.Sprintf("coder-k8s sets this label from Coder (%q); it cannot be changed", d)
			}
			errs = append(errs, field.Invalid(labelsPath.Key(k), v, msg))
		}
	}
	errs = append(errs, apivalidation.ValidateAnnotations(want.GetAnnotations(), field.NewPath("metadata", "annotations"))...)
	errs = append(errs, apivalidation.ValidateFinalizers(want.GetFinalizers(), finalizersPath)...)
	errs = append(errs, apivalidation.ValidateOwnerReferences(want.GetOwnerReferences(), field.NewPath("metadata", "ownerReferences"))...)
	errs = append(errs, metav1validation.ValidateManagedFields(want.GetManagedFields(), field.NewPath("metadata", "managedFields"))...)
	if cur != nil && cur.GetDeletionTimestamp() != nil {
		errs = append(errs, apivalidation.ValidateNoNewFinalizers(want.GetFinalizers(), cur.GetFinalizers(), finalizersPath)...)
	}
	return errs
}

// userFinalizers are the finalizers a record keeps: all but coder-k8s'
// own delete-build finalizer.
func userFinalizers(in []string) []string {
	var out []string
	for _, f := range in {
		if f != FinalizerDeleteBuild {
			out = append(out, f)
		}
	}
	return out
}

// heldByFinalizers reports whether o's deletion waits for finalizers set
// through Kubernetes.
func heldByFinalizers(o object) bool { return len(userFinalizers(o.GetFinalizers())) > 0 }

// releasesDelete reports whether next removes the last finalizer that
// held cur's deletion (a deletionTimestamp without coder-k8s' own
// delete-build finalizer is one set by a held delete).
func releasesDelete(cur, next object) bool {
	return cur.GetDeletionTimestamp() != nil && !slices.Contains(cur.GetFinalizers(), FinalizerDeleteBuild) && !heldByFinalizers(next)
}

// recordedMeta is the part of a record a write compares: what the object
// shows.
type recordedMeta struct {
	Name              string
	Generation        int64
	SpecHash          string
	Labels            map[string]string
	Annotations       map[string]string
	Finalizers        []string
	OwnerReferences   []metav1.OwnerReference
	ManagedFields     []metav1.ManagedFieldsEntry
	DeletionTimestamp *metav1.Time
}

func metaOf(s *records.Record) recordedMeta {
	m := recordedMeta{Name: s.Spec.Name, Generation: s.Spec.Generation, SpecHash: s.Spec.SpecHash,
		Labels: s.Spec.Labels, Annotations: s.Spec.Annotations, Finalizers: s.Spec.Finalizers,
		OwnerReferences: s.Spec.OwnerReferences, ManagedFields: s.Spec.ManagedFields, DeletionTimestamp: s.Spec.DeletionTimestamp}
	if len(m.Labels) == 0 {
		m.Labels = nil
	}
	if len(m.Annotations) == 0 {
		m.Annotations = nil
	}
	if len(m.ManagedFields) == 0 {
		m.ManagedFields = coderdOwnsStatus()
	}
	return m
}

// write is one write request's view of an object's metadata: the backend,
// the record's key, the record as it was (nil when none) and the object
// as it was (nil for a create). Every write saves at most one record,
// through commit.
type write struct {
	r    *resource
	t    target
	key  records.Key
	prev *records.Record
	cur  object
}

// beginWrite reads the record of the object cur (read from coderd).
func (r *resource) beginWrite(ctx context.Context, t target, cur object) (*write, error) {
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
func (r *resource) createWrite(t target, out object) *write {
	return &write{r: r, t: t, key: r.recordKey(t, string(out.GetUID()))}
}

func (r *resource) recordKey(t target, coderID string) records.Key {
	return records.Key{Namespace: t.Namespace, Resource: r.gr.Resource, ControlPlane: t.ControlPlane, CoderID: coderID}
}

// record is the record the write leaves: want's metadata (the request's
// object, with managedFields as the field manager computed them), the
// generation counted from cur to out (the object as Coder has it after
// the write), the deletionTimestamp kept, then mutate's changes (a
// template build, a deletion).
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
	hash := specHashOf(out)
	switch {
	case w.cur == nil:
		rec.Spec.Generation = 1
	case specHashOf(w.cur) != hash:
		rec.Spec.Generation = max(w.cur.GetGeneration(), 1) + 1
	default:
		rec.Spec.Generation = max(w.cur.GetGeneration(), 1)
	}
	rec.Spec.SpecHash = hash
	if mutate != nil {
		mutate(rec)
	}
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
		if gerr != nil {
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

// forget deletes the record after Coder deleted the object.
func (w *write) forget(ctx context.Context) error {
	if w.prev == nil {
		return nil
	}
	if err := w.r.records.delete(ctx, w.prev, w.key); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("the object was deleted in Coder, but deleting its Kubernetes metadata failed: %w", err))
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

// publishRead merges an object just read from coderd with its record and
// stores it in the watch cache.
func (r *resource) publishRead(ctx context.Context, t target, obj object) (object, error) {
	rec, err := r.records.get(ctx, r.recordKey(t, string(obj.GetUID())))
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	mergeRecord(obj, rec)
	return r.cache.Upsert(t.Key(), obj)[0].(object), nil
}

// mergeListed merges a backend's list of objects with their records, and
// queues the records' upkeep: a spec change made in Coder is counted
// (generation), and, when the list is complete, records whose Coder object
// is gone are deleted (a partial list, one page of several, says nothing
// about the objects it lacks). started is when the list began.
//
// merge, when not nil, merges objs[i] with rec (nil: none) in place of
// mergeRecord: it returns the object to list in its place and the spec
// hash to count when the merge found a spec change made in Coder ("" when
// not).
func (r *resource) mergeListed(ctx context.Context, t target, objs []watchcache.Object, started time.Time, complete bool,
	merge func(i int, rec *records.Record) (watchcache.Object, string)) error {
	recs, err := r.records.list(ctx, t.Namespace, r.gr.Resource, t.ControlPlane)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(objs))
	for i, o := range objs {
		id := string(o.GetUID())
		seen[id] = true
		rec := recs[id]
		var specHash string
		if merge != nil {
			objs[i], specHash = merge(i, rec)
		} else if mergeRecord(o, rec) {
			specHash = specHashOf(o)
		}
		if specHash != "" && rec != nil {
			r.records.enqueue(recordJob{key: records.KeyOf(rec), rv: rec.ResourceVersion, specHash: specHash})
		}
	}
	for id, rec := range recs {
		if complete && id != "" && !seen[id] && rec.CreationTimestamp.Add(cleanupGrace).Before(started) {
			r.records.enqueue(recordJob{key: records.KeyOf(rec), rv: rec.ResourceVersion, gone: true})
		}
	}
	return nil
}

// onRecordChange re-merges the cached object of a record that changed
// (written by this or another replica, or by hand), so that open watches
// see the new metadata.
func (r *resource) onRecordChange(rec *records.Record) {
	if rec.Spec.Resource != r.gr.Resource {
		return
	}
	key := rec.Namespace + "/" + rec.Spec.ControlPlane
	obj := r.cachedByUID(key, rec.Spec.Name, rec.Spec.CoderID)
	if obj == nil {
		return
	}
	cur, err := r.records.get(context.Background(), records.KeyOf(rec))
	if err != nil {
		r.log.Error(err, "re-merging a changed record", "record", rec.Name)
		return
	}
	mergeRecord(obj, cur)
	r.cache.Upsert(key, obj)
}

// cachedByUID finds the cached object of backend key with Coder ID id,
// trying the name it had when last written first.
func (r *resource) cachedByUID(key, name, id string) object {
	if o, ok := r.cache.Get(key, name); ok && string(o.GetUID()) == id {
		return o.(object)
	}
	objs, _ := r.cache.Snapshot(func(k string) bool { return k == key })
	for _, o := range objs {
		if string(o.GetUID()) == id {
			return o.(object)
		}
	}
	return nil
}

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

func newRecordView(s *records.Store, r *resource) *recordView {
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
// (the informer delivers another writer's change within milliseconds).
func (v *recordView) waitNewer(ctx context.Context, k records.Key, stale string) (*records.Record, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		rec, err := v.get(ctx, k)
		if err != nil {
			return nil, err
		}
		if rec != nil && rec.ResourceVersion != stale {
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
