package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

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
	case *aggv1.CoderTemplateVersion:
		spec = &v.Spec
	case *aggv1.CoderUser:
		spec = &v.Spec
	case *aggv1.CoderGroup:
		spec = &v.Spec
	case *aggv1.CoderOrganization:
		spec = &v.Spec
	}
	data, _ := json.Marshal(spec) // plain structs of strings, maps and numbers
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:16])
}

// shownSpecHash is specHashOf o as it shows once merged with rec: a
// template's durations spelled as rec has them.
func shownSpecHash(o object, rec *records.Record) string {
	tpl, ok := o.(*aggv1.CoderTemplate)
	if !ok {
		return specHashOf(o)
	}
	// showDurations replaces pointers, so a shallow copy of the spec
	// leaves o as it is.
	shown := &aggv1.CoderTemplate{Spec: tpl.Spec}
	showDurations(&shown.Spec, rec)
	return specHashOf(shown)
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
	case *aggv1.CoderTemplateVersion:
		v.Status.ObservedGeneration = gen
		conds = v.Status.Conditions
	case *aggv1.CoderUser:
		v.Status.ObservedGeneration = gen
	case *aggv1.CoderGroup:
		v.Status.ObservedGeneration = gen
	case *aggv1.CoderOrganization:
		v.Status.ObservedGeneration = gen
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
// rec last counted (a change made in Coder, not yet counted in rec). A
// template's durations are spelled as rec recorded them.
func mergeRecord(o object, rec *records.Record) (specChangedInCoder bool) {
	if tpl, ok := o.(*aggv1.CoderTemplate); ok {
		// Part of the spec as shown, so before its hash.
		showDurations(&tpl.Spec, rec)
	}
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
	Durations         map[string]string
}

func metaOf(s *records.Record) recordedMeta {
	m := recordedMeta{Name: s.Spec.Name, Generation: s.Spec.Generation, SpecHash: s.Spec.SpecHash,
		Labels: s.Spec.Labels, Annotations: s.Spec.Annotations, Finalizers: s.Spec.Finalizers,
		OwnerReferences: s.Spec.OwnerReferences, ManagedFields: s.Spec.ManagedFields, DeletionTimestamp: s.Spec.DeletionTimestamp,
		Durations: s.Spec.Durations}
	if len(m.Durations) == 0 {
		m.Durations = nil
	}
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

// publishRead merges an object just read from coderd with its record and
// stores it in the watch cache.
func (r *genericStore) publishRead(ctx context.Context, t target, obj object) (object, error) {
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
func (r *genericStore) mergeListed(ctx context.Context, t target, objs []watchcache.Object, started time.Time, complete bool,
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
// see the new metadata. The merge replaces the cached object only if no
// newer one was stored meanwhile (a request's answer, a poll, the
// promoter's re-read): a merge into the object it replaced would bring
// back Coder's older view with the new metadata (a template's previous
// build shown again as current). Such a newer object is merged again.
func (r *genericStore) onRecordChange(rec *records.Record) {
	if rec.Spec.Resource != r.gr.Resource {
		return
	}
	key := rec.Namespace + "/" + rec.Spec.ControlPlane
	for range recordMergeTries {
		obj := r.cachedByUID(key, rec.Spec.Name, rec.Spec.CoderID)
		if obj == nil {
			return
		}
		cur, err := r.records.get(context.Background(), records.KeyOf(rec))
		if err != nil {
			r.log.Error(err, "re-merging a changed record", "record", rec.Name)
			return
		}
		rv := obj.GetResourceVersion()
		mergeRecord(obj, cur)
		if r.recordMerged != nil {
			r.recordMerged(cur)
		}
		if r.cache.UpsertIfUnchanged(key, obj, rv) {
			return
		}
	}
	// Each try lost to a newer object, each merged with the records as
	// they were when it was made; the next read or poll merges again.
	r.log.V(1).Info("re-merging a changed record: the cached object kept changing; left to the next read", "record", rec.Name)
}

// recordMergeTries bounds onRecordChange's merges that lose to a newer
// object.
const recordMergeTries = 5

// cachedByUID finds the cached object of backend key with Coder ID id,
// trying the name it had when last written first.
func (r *genericStore) cachedByUID(key, name, id string) object {
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

// coderdOwnsStatus is the managedFields entry every object carries: coderd
// owns the status. Coder has nowhere to keep Kubernetes field ownership,
// so appliers' entries are not stored; without any entry, server-side
// apply would treat every field as owned by "before-first-apply" and
// refuse each change as a conflict. With this one, applies change the
// fields they set (no field-owner conflicts between appliers, and fields
// dropped from an apply configuration are left as they are).
func coderdOwnsStatus() []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{
		Manager:    "coderd",
		Operation:  metav1.ManagedFieldsOperationUpdate,
		APIVersion: aggv1.SchemeGroupVersion.String(),
		FieldsType: "FieldsV1",
		FieldsV1:   metav1.NewFieldsV1(`{"f:status":{}}`),
	}}
}
