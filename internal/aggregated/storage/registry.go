package storage

import (
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// The verbs of both kinds, written once, in the shape of
// k8s.io/apiserver's generic registry: the steps every verb takes (for a
// write: read the current object, preconditions, admission, the dry run,
// the record write, the watch cache, the answer) are here; what differs
// per kind (the list type, the Coder calls, which spec changes Coder must
// make) comes from the kind's strategy, which its storage implements.

// restStorage is every k8s.io/apiserver interface a kind's storage
// serves (asserted at compile time for each kind).
type restStorage interface {
	rest.Storage
	rest.Scoper
	rest.KindProvider
	rest.SingularNameProvider
	rest.ShortNamesProvider
	rest.CategoriesProvider
	rest.Getter
	rest.Lister
	rest.Watcher
	rest.Creater
	rest.Updater
	rest.GracefulDeleter
	rest.TableConvertor
}

var (
	_ restStorage = (*WorkspaceStorage)(nil)
	_ restStorage = (*TemplateStorage)(nil)
	_ restStorage = (*TemplateVersionStorage)(nil)
	_ restStorage = (*GroupStorage)(nil)
	_ restStorage = (*OrganizationStorage)(nil)
)

// strategy is what a kind tells the shared verbs.
type strategy[N objectName, T object] interface {
	objectStore[N, T]
	New() runtime.Object
	Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error)
	// listOf is the kind's list answer of objs (the cache's, shared) at
	// resourceVersion rv.
	listOf(objs []watchcache.Listed, rv string) runtime.Object
	// validateUpdate checks the kind's own rules for next, an update of
	// cur; Kubernetes metadata is checked by the registry.
	validateUpdate(next, cur T, name string) field.ErrorList
	// planUpdate compares next with cur: what Coder must change.
	planUpdate(n N, name string, cur, next T) specUpdate
	// releaseDelete serves an update that changes no spec field but
	// removes the last finalizer holding cur's deletion: the deletion
	// starts in Coder now (nothing is written on a dry run).
	releaseDelete(ctx context.Context, w *write, n N, name string, cur, next T, dryRun bool) (runtime.Object, error)

	// validateCreate checks the kind's own rules for a new object and
	// parses its name.
	validateCreate(o T) (N, field.ErrorList)
	// createdView is what a create of o would show, without asking
	// coderd: what admission sees (with the request's metadata), the dry
	// run's answer, and the derived labels it checks.
	createdView(o T, t target, n N) T
	// planCreate checks o against coderd and returns the call that
	// creates it. On a dry run it completes dry and returns no call.
	planCreate(ctx context.Context, t target, n N, o, dry T, dryRun bool) (createCall, error)

	// deleteUnderWay says a delete of cur needs nothing more: cur is
	// already being deleted.
	deleteUnderWay(cur T) bool
	// deletePreview is a dry-run delete's answer, and whether the object
	// would be gone at once.
	deletePreview(cur T) (runtime.Object, bool)
	// deleteInCoder deletes cur in Coder: the answer, whether the object
	// is gone, and the error.
	deleteInCoder(ctx context.Context, w *write, n N, name string, cur T) (runtime.Object, bool, error)
}

// listObjects serves List: what the request may see of its namespace
// (or of every namespace), as the kind's list.
func listObjects[N objectName, T object](ctx context.Context, s strategy[N, T], opts *metainternalversion.ListOptions) (runtime.Object, error) {
	objs, rv, err := s.store().list(ctx, opts)
	if err != nil {
		return nil, err
	}
	return s.listOf(objs, rv), nil
}

// createCall creates the object in Coder and returns Coder's view of it
// and the record's own changes (nil for none).
type createCall func(ctx context.Context) (object, func(*records.Record), error)

// createObject serves Create.
func createObject[N objectName, T object](ctx context.Context, s strategy[N, T], obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	r := s.store()
	o, n, t, err := toCreate(ctx, r, obj, s.validateCreate)
	if err != nil {
		return nil, err
	}
	dry := s.createdView(o, t, n)
	if errs := validateMeta(o, dry.GetLabels(), nil); len(errs) > 0 {
		return nil, r.invalid(o.GetName(), errs)
	}
	// Admission sees the object as the create stores it (the derived
	// labels, namespace and organization with the request's metadata), as
	// an update sees it. It runs before the caller is mapped and before
	// coderd is asked anything, so that a refused create changes nothing
	// in Coder (not even a token minted for the caller), and a dry run is
	// refused exactly as the real create.
	if createValidation != nil {
		if err := createValidation(ctx, r.createWrite(t, dry).preview(o, dry.DeepCopyObject().(object), nil)); err != nil {
			return nil, err
		}
	}
	if t, err = r.createAs(ctx, t, o.GetName()); err != nil {
		return nil, err
	}
	dryRun := opts != nil && isDryRun(opts.DryRun)
	create, err := s.planCreate(ctx, t, n, o, dry, dryRun)
	if err != nil {
		return nil, err
	}
	if dryRun {
		return r.createWrite(t, dry).preview(o, dry, nil), nil
	}
	out, mutate, err := create(ctx)
	if err != nil {
		return nil, err
	}
	return r.createWrite(t, out).commit(ctx, o, out, mutate)
}

// specUpdate is a kind's plan for an update's spec.
type specUpdate struct {
	// changed says Coder's side of the object changes; otherwise only the
	// record is written.
	changed bool
	// invalid is what the change itself breaks (checked with the
	// object's rules, after its metadata).
	invalid field.ErrorList
	// apply makes the change in Coder, acting as w.t, and returns Coder's
	// view of the object after it and the record's own changes (nil for
	// none).
	apply func(ctx context.Context, w *write) (object, func(*records.Record), error)
	// check, when set, runs after admission and before anything changes,
	// on a dry run too, acting as w.t: it refuses what coderd cannot do
	// (a template setting its license lacks) or the caller may not read
	// (a Secret), and reports whether Coder's side changes after all,
	// though the spec did not (a Secret a value came from changed).
	check func(ctx context.Context, w *write) (bool, error)
	// dryView, when set, completes a dry run's answer (cur with next's
	// spec) with what the real write would show that the spec does not
	// say (the files of a version it makes active).
	dryView func(ctx context.Context, w *write, out object) error
}

// updateObject serves Update. With forceAllowCreate (server-side apply)
// a missing object is created.
func updateObject[N objectName, T object](ctx context.Context, s strategy[N, T], name string, objInfo rest.UpdatedObjectInfo,
	createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	r := s.store()
	t, n, cur, err := current(ctx, s, name)
	next, created, err := updatedObject(ctx, r, name, cur, err, objInfo, forceAllowCreate, s.New(),
		func(obj runtime.Object) (runtime.Object, error) {
			return s.Create(ctx, obj, createValidation, createOptions(opts))
		})
	if created != nil || err != nil {
		return created, err == nil, err
	}
	if t, err = r.mayWrite(ctx, t, cur, codersdk.ActionUpdate); err != nil {
		return nil, false, err
	}
	plan := s.planUpdate(n, name, cur, next)
	errs := s.validateUpdate(next, cur, name)
	errs = append(errs, validateMeta(next, derivedLabels(cur.GetLabels()), cur)...)
	errs = append(errs, plan.invalid...)
	if len(errs) > 0 {
		return nil, false, r.invalid(name, errs)
	}
	if updateValidation != nil {
		if err := updateValidation(ctx, next, cur); err != nil {
			return nil, false, err
		}
	}
	w, err := r.beginWrite(ctx, t, cur)
	if err != nil {
		return nil, false, err
	}
	dryRun := opts != nil && isDryRun(opts.DryRun)
	if plan.check != nil {
		changed, err := plan.check(ctx, w)
		if err != nil {
			return nil, false, err
		}
		plan.changed = plan.changed || changed
	}
	if !plan.changed {
		if releasesDelete(cur, next) {
			out, err := s.releaseDelete(ctx, w, n, name, cur, next, dryRun)
			return out, false, err
		}
		if !w.changes(w.record(next, cur, nil)) {
			return cur, false, nil
		}
		// Only Kubernetes metadata changes: Coder is not asked.
		if dryRun {
			return w.preview(next, cur.DeepCopyObject().(object), nil), false, nil
		}
		out, err := w.commit(ctx, next, cur.DeepCopyObject().(object), nil)
		return out, false, err
	}
	if err := r.specChange(t, name); err != nil {
		return nil, false, err
	}
	if cur.GetDeletionTimestamp() != nil {
		return nil, false, apierrors.NewConflict(r.gr, name, fmt.Errorf("the %s is being deleted", r.noun()))
	}
	if dryRun {
		out := withSpecOf(cur, next)
		if plan.dryView != nil {
			if err := plan.dryView(ctx, w, out); err != nil {
				return nil, false, err
			}
		}
		return w.preview(next, out, nil), false, nil
	}
	out, mutate, err := plan.apply(ctx, w)
	if err != nil {
		return nil, false, err
	}
	res, err := w.commit(ctx, next, out, mutate)
	return res, false, err
}

// deleteObject serves Delete. An object with finalizers is only marked
// for deletion; Coder is asked once they are removed (see releaseDelete).
func deleteObject[N objectName, T object](ctx context.Context, s strategy[N, T], name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	r := s.store()
	t, n, cur, err := toDelete(ctx, r, s, name, deleteValidation, opts)
	if err != nil {
		return nil, false, err
	}
	if s.deleteUnderWay(cur) {
		return cur, false, nil
	}
	w, err := r.beginWrite(ctx, t, cur)
	if err != nil {
		return nil, false, err
	}
	dryRun := opts != nil && isDryRun(opts.DryRun)
	if heldByFinalizers(cur) {
		if cur.GetDeletionTimestamp() != nil {
			// Already marked: the finalizers still hold it.
			return cur, false, nil
		}
		out, err := w.holdDelete(ctx, dryRun)
		return out, false, err
	}
	if dryRun {
		out, gone := s.deletePreview(cur)
		return out, gone, nil
	}
	return s.deleteInCoder(ctx, w, n, name, cur)
}

// deletedAtOnce is the delete of a kind that Coder deletes (or archives)
// at once: nothing is left under way, and a dry run shows the object gone.
type deletedAtOnce[T object] struct{}

func (deletedAtOnce[T]) deleteUnderWay(T) bool { return false }

func (deletedAtOnce[T]) deletePreview(cur T) (runtime.Object, bool) { return cur, true }

// releaseAtOnce is releaseDelete of such a kind: del deletes cur in Coder
// once the last finalizer holding it is gone (not on a dry run), and its
// record goes with it.
func releaseAtOnce[T object](ctx context.Context, w *write, cur, next T, dryRun bool, del func(context.Context) error) (runtime.Object, error) {
	out := w.preview(next, cur.DeepCopyObject().(object), nil)
	if dryRun {
		return out, nil
	}
	if err := del(ctx); err != nil {
		return nil, err
	}
	return out, w.forget(ctx)
}

// deleteAtOnce is deleteInCoder of such a kind.
func deleteAtOnce[T object](ctx context.Context, w *write, cur T, del func(context.Context) error) (runtime.Object, bool, error) {
	if err := del(ctx); err != nil {
		return nil, false, err
	}
	return cur, true, w.forget(ctx)
}

// noun names one object of the resource in messages: "workspace".
func (r *genericStore) noun() string {
	switch r.kind {
	case "CoderWorkspace":
		return "workspace"
	case "CoderTemplate":
		return "template"
	case "CoderTemplateVersion":
		return "template version"
	case "CoderUser":
		return "user"
	case "CoderGroup":
		return "group"
	case "CoderOrganization":
		return "organization"
	}
	return r.kind
}

// withSpecOf is a copy of cur with next's spec: what a dry-run update
// that changes the spec shows (a template's settings that next leaves
// unset keep cur's values).
func withSpecOf[T object](cur, next T) T {
	out := cur.DeepCopyObject().(T)
	switch o := any(out).(type) {
	case *aggv1.CoderWorkspace:
		o.Spec = any(next).(*aggv1.CoderWorkspace).Spec
	case *aggv1.CoderTemplate:
		kept := o.Spec
		o.Spec = *any(next).(*aggv1.CoderTemplate).Spec.DeepCopy()
		keepSettings(&o.Spec, &kept)
	case *aggv1.CoderTemplateVersion:
		o.Spec = *any(next).(*aggv1.CoderTemplateVersion).Spec.DeepCopy()
	case *aggv1.CoderUser:
		// Unset roles, organizations and login type keep Coder's.
		kept := o.Spec
		o.Spec = *any(next).(*aggv1.CoderUser).Spec.DeepCopy()
		if o.Spec.Roles == nil {
			o.Spec.Roles = kept.Roles
		}
		if o.Spec.Organizations == nil {
			o.Spec.Organizations = kept.Organizations
		}
		if o.Spec.LoginType == "" {
			o.Spec.LoginType = kept.LoginType
		}
		sortedSpec(&o.Spec)
	case *aggv1.CoderGroup:
		// Fields next leaves unset keep Coder's values.
		n := any(next).(*aggv1.CoderGroup).Spec.DeepCopy()
		keepUnset(&n.DisplayName, o.Spec.DisplayName)
		keepUnset(&n.AvatarURL, o.Spec.AvatarURL)
		keepUnset(&n.QuotaAllowance, o.Spec.QuotaAllowance)
		if n.Members == nil {
			n.Members = o.Spec.Members
		}
		n.Members = sortedMembers(n.Members)
		if n.Organization == "" {
			n.Organization = o.Spec.Organization
		}
		o.Spec = *n
		o.Status.MemberCount = int32(len(n.Members))
	case *aggv1.CoderOrganization:
		n := any(next).(*aggv1.CoderOrganization).Spec.DeepCopy()
		keepUnset(&n.DisplayName, o.Spec.DisplayName)
		keepUnset(&n.Description, o.Spec.Description)
		keepUnset(&n.Icon, o.Spec.Icon)
		o.Spec = *n
	}
	return out
}

// keepUnset sets *next to cur when next leaves the field unset.
func keepUnset[V any](next **V, cur *V) {
	if *next == nil {
		*next = cur
	}
}
