package storage

import (
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// The request paths below are the same for templates and workspaces; what
// differs is the object type T and how an object name N maps onto Coder.
// The typed REST methods stay on each storage (the apiserver calls them)
// and hand their kind's part to these.

// object is a CoderTemplate or CoderWorkspace (by pointer).
type object interface {
	runtime.Object
	metav1.Object
}

// objectName is a parsed object name; the control plane part (empty
// without a prefix) picks the backend.
type objectName interface {
	controlPlane() string
}

func (n workspaceName) controlPlane() string       { return n.ControlPlane }
func (n templateObjectName) controlPlane() string  { return n.ControlPlane }
func (n templateVersionName) controlPlane() string { return n.ControlPlane }
func (n groupObjectName) controlPlane() string     { return n.ControlPlane }
func (n orgObjectName) controlPlane() string       { return n.ControlPlane }

// objectStore is what a kind's storage tells the shared paths: how a name
// is parsed and how the object it names is read from coderd.
type objectStore[N objectName, T object] interface {
	lookup(ctx context.Context, name string) (target, N, error)
	read(ctx context.Context, t target, n N, name string) (T, error)
	store() *genericStore
}

// lookupName parses name and finds its backend. A malformed name is
// NotFound: no object can have it.
func lookupName[N objectName](ctx context.Context, r *genericStore, name string, parse func(string) (N, error)) (target, N, error) {
	n, err := parse(name)
	if err != nil {
		return target{}, n, r.badName(name, err)
	}
	t, err := r.resolve(ctx, namespaceOf(ctx), n.controlPlane(), name)
	if err != nil {
		return t, n, err
	}
	t, err = r.caller(ctx, t, name)
	return t, n, err
}

// store is the kind's generic store, for the shared paths.
func (r *genericStore) store() *genericStore { return r }

// current reads the object name refers to from coderd: Get, Update and
// Delete start from it.
func current[N objectName, T object](ctx context.Context, s objectStore[N, T], name string) (target, N, T, error) {
	t, n, err := s.lookup(ctx, name)
	if err != nil {
		var zero T
		return t, n, zero, err
	}
	// Read as the operator, so that what the request sees is what the
	// shared cache holds, then shown as the caller may see it.
	cur, err := s.read(ctx, t, n, name)
	if t.caller != nil && apierrors.IsNotFound(err) {
		// Whatever coderd said: the same 404 as for an object the
		// caller may not read.
		err = s.store().hidden(name)
	}
	if err != nil {
		return t, n, cur, err
	}
	shown, err := s.store().filterOne(ctx, t, cur)
	if err != nil {
		var zero T
		return t, n, zero, err
	}
	return t, n, shown.(T), nil
}

// getObject serves Get. A caller with no Coder user in the backend gets
// the 404 of an object that does not exist.
func getObject[N objectName, T object](ctx context.Context, s objectStore[N, T], name string) (runtime.Object, error) {
	_, _, obj, err := current(ctx, s, name)
	if err != nil {
		return nil, s.store().refusedReads(name, err)
	}
	return obj, nil
}

// toCreate checks a create request: the object's type, the kind's own
// rules (validate), and finds the backend it goes to. The caller is not
// mapped yet: admission runs first (createObject).
func toCreate[N objectName, T object](ctx context.Context, r *genericStore, obj runtime.Object, validate func(T) (N, field.ErrorList)) (T, N, target, error) {
	var n N
	o, ok := obj.(T)
	if !ok {
		return o, n, target{}, apierrors.NewBadRequest(fmt.Sprintf("expected a %s, got %T", r.kind, obj))
	}
	n, errs := validate(o)
	if len(errs) > 0 {
		return o, n, target{}, r.invalid(o.GetName(), errs)
	}
	t, err := r.resolve(ctx, namespaceOf(ctx), n.controlPlane(), o.GetName())
	return o, n, t, err
}

// createAs maps the create's caller onto their Coder user in t and
// returns t acting as them: coderd decides whether they may create.
func (r *genericStore) createAs(ctx context.Context, t target, name string) (target, error) {
	t, err := r.caller(ctx, t, name)
	if err == nil && t.controller != nil {
		err = r.controllerRefused(t, name, "create "+r.gr.Resource)
	}
	return t.acting(), err
}

// toDelete reads the object a delete request names and checks the
// request's preconditions and deleteValidation against it.
func toDelete[N objectName, T object](ctx context.Context, r *genericStore, s objectStore[N, T], name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (target, N, T, error) {
	t, n, cur, err := current(ctx, s, name)
	if err != nil {
		return t, n, cur, err
	}
	if err := r.checkDeletePreconditions(name, cur, opts); err != nil {
		return t, n, cur, err
	}
	if deleteValidation != nil {
		if err := deleteValidation(ctx, cur); err != nil {
			return t, n, cur, err
		}
	}
	t, err = r.mayWrite(ctx, t, cur, codersdk.ActionDelete)
	return t, n, cur, err
}

// checkResourceVersion applies optimistic concurrency: the caller's
// resourceVersion must describe the content coderd has now.
func (r *genericStore) checkResourceVersion(name, given, current string) error {
	if given == "" || watchcache.SameContent(given, current) {
		return nil
	}
	return r.conflict(name)
}

func isDryRun(dryRun []string) bool { return len(dryRun) > 0 }

// checkDeletePreconditions honours DeleteOptions.Preconditions.
func (r *genericStore) checkDeletePreconditions(name string, cur metav1.Object, opts *metav1.DeleteOptions) error {
	if opts == nil || opts.Preconditions == nil {
		return nil
	}
	if uid := opts.Preconditions.UID; uid != nil && *uid != cur.GetUID() {
		return apierrors.NewConflict(r.gr, name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *uid, cur.GetUID()))
	}
	if rv := opts.Preconditions.ResourceVersion; rv != nil {
		return r.checkResourceVersion(name, *rv, cur.GetResourceVersion())
	}
	return nil
}

// updatedObject is what an update request asks for: objInfo applied to a
// copy of cur, whose resourceVersion (if given) must still describe cur.
// When the object does not exist (readErr is NotFound) and
// forceAllowCreate is set, as for server-side apply's create-on-apply, it
// creates the object from objInfo applied to empty and returns the result
// as created.
func updatedObject[T object](ctx context.Context, r *genericStore, name string, cur T, readErr error, objInfo rest.UpdatedObjectInfo,
	forceAllowCreate bool, empty runtime.Object, create func(runtime.Object) (runtime.Object, error)) (next T, created runtime.Object, err error) {
	var zero T
	if readErr != nil {
		if !forceAllowCreate || !apierrors.IsNotFound(readErr) {
			return zero, nil, readErr
		}
		obj, err := objInfo.UpdatedObject(ctx, empty)
		if err != nil {
			return zero, nil, err
		}
		created, err := create(obj)
		return zero, created, err
	}
	obj, err := objInfo.UpdatedObject(ctx, cur.DeepCopyObject())
	if err != nil {
		return zero, nil, err
	}
	next, ok := obj.(T)
	if !ok {
		return zero, nil, apierrors.NewBadRequest(fmt.Sprintf("expected a %s, got %T", r.kind, obj))
	}
	if err := r.checkResourceVersion(name, next.GetResourceVersion(), cur.GetResourceVersion()); err != nil {
		return zero, nil, err
	}
	return next, nil, nil
}

func createOptions(o *metav1.UpdateOptions) *metav1.CreateOptions {
	if o == nil {
		return &metav1.CreateOptions{}
	}
	return &metav1.CreateOptions{DryRun: o.DryRun, FieldManager: o.FieldManager, FieldValidation: o.FieldValidation}
}
