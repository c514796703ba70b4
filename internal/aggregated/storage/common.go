// Package storage holds the REST storage of the aggregated API's
// resources, coderworkspaces and codertemplates: each request is served by
// calling the coderd of the namespace's control plane, and a shared watch
// cache turns coderd's state into watch events.
package storage

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/coderstatus"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// Options configures both resources' storage.
type Options struct {
	// Backends finds the coderd serving a namespace.
	Backends backend.Provider
	// PollInterval is how often the shared poller lists from coderd while
	// someone watches.
	PollInterval time.Duration
	// Records keeps the Kubernetes metadata Coder cannot store.
	Records *records.Store
	// Log receives the storage's logs; never tokens.
	Log logr.Logger
	// WorkspacePageSize is how many workspaces one list request asks
	// coderd for; 0 means DefaultWorkspacePageSize.
	WorkspacePageSize int
	// Identity maps callers onto Coder users for the backends in Mapped
	// mode. Nil: every request acts as the operator (tests of storage
	// alone).
	Identity *identity.Service
}

// target is a backend as one request sees it: prefixed says whether its
// namespace holds several control planes, so that object names carry the
// control plane's name.
type target struct {
	backend.Backend
	prefixed bool
	// caller is the request's Coder user when the backend maps
	// identities; nil when the operator acts (Operator mode, the poller).
	caller *identity.Caller
	// controller is set instead of caller for one of the cluster's
	// controllers: the operator acts, and it may only read (restricted
	// fields removed), delete and change Kubernetes metadata.
	controller *identity.Caller
	// operator is the operator's client once Client acts as the caller.
	operator *codersdk.Client
}

// coderdKey identifies, for the caches of what coderd answered, the
// coderd behind t and who asks it: the backend (namespace and control
// plane) and the URL its client calls. IDs are only unique within one
// coderd, and a tenant's coderd may answer with any ID it likes, so an
// entry read from one backend's coderd is never served for another.
func (t target) coderdKey() string {
	u := ""
	if t.Client != nil && t.Client.URL != nil {
		u = t.Client.URL.String()
	}
	return t.Key() + " " + u
}

// targetsOf marks the backends of namespaces that have several.
func targetsOf(backends []backend.Backend) []target {
	perNamespace := map[string]int{}
	for _, b := range backends {
		perNamespace[b.Namespace]++
	}
	out := make([]target, len(backends))
	for i, b := range backends {
		out[i] = target{Backend: b, prefixed: perNamespace[b.Namespace] > 1}
	}
	return out
}

// resource holds what both REST types share: the backends, the watch
// cache fed by the shared poller, and list, watch and the discovery facts.
type resource struct {
	gr       schema.GroupResource
	kind     string
	backends backend.Provider
	ident    *identity.Service
	access   access
	// callerLists says a list that reads coderd reads it as the caller
	// (coderd filters, and answers in proportion to what the caller
	// sees); otherwise it reads everything as the operator and filters.
	callerLists bool
	log         logr.Logger
	// fields maps Coder's JSON field names in validation errors onto the
	// resource's field paths.
	fields map[string]string

	cache    *watchcache.Cache
	records  *recordView
	interval time.Duration
	// listBackend reads every object of one coderd.
	listBackend func(context.Context, target) ([]watchcache.Object, error)
	// selectable returns what label and field selectors match on.
	selectable func(watchcache.Object) (map[string]string, fields.Set)
	// sourcesListed, when set, is told the backends each time the
	// poller lists them, so that what is kept per backend is dropped
	// once a backend is gone.
	sourcesListed func([]target)

	// bg is Run's context, which background probes of failing backends
	// run in; probing holds the keys being probed, and probes waits for
	// them when Run ends.
	bg      atomic.Pointer[context.Context]
	probing sync.Map
	probes  sync.WaitGroup
}

const historySize = 2000

// startCache creates the watch cache of a resource whose objects are *T:
// list reads every object of one coderd, and selectors match the
// objects' labels and selectFields. r must be the resource inside its
// storage: the cache keeps r.sources.
func startCache[T any, PT interface {
	*T
	watchcache.Object
}](r *resource, o Options, list func(context.Context, target) ([]watchcache.Object, error), selectFields func(PT) fields.Set) error {
	r.listBackend = list
	r.selectable = func(o watchcache.Object) (map[string]string, fields.Set) {
		obj := o.(PT)
		return obj.GetLabels(), selectFields(obj)
	}
	r.interval = o.PollInterval
	r.records = newRecordView(o.Records, r)
	var err error
	r.cache, err = watchcache.New(watchcache.Options{
		NewObject: func() watchcache.Object { return PT(new(T)) },
		Sources:   r.sources,
		Interval:  o.PollInterval,
		// Enough to resume a watch across a few polls that changed every
		// object of a large deployment; older resumes get 410 and relist.
		// Each retained event keeps an object alive.
		HistorySize: historySize,
		Logger:      r.log,
	})
	return err
}

// Run polls coderd for the watch cache, and keeps the records and the
// cached objects' metadata in step, until ctx ends.
func (r *resource) Run(ctx context.Context) {
	r.bg.Store(&ctx)
	defer r.probes.Wait()
	if r.records.store != nil {
		if err := r.records.store.OnChange(ctx, func(rec *records.Record, _ bool) { r.onRecordChange(rec) }); err != nil {
			r.log.Error(err, "watching records; metadata changed elsewhere shows on the next poll")
		}
		var upkeep sync.WaitGroup
		upkeep.Go(func() { r.records.run(ctx) })
		defer upkeep.Wait()
	}
	r.cache.Run(ctx)
}

// Cache exposes the watch cache's figures for metrics and benchmarks.
func (r *resource) Cache() *watchcache.Cache { return r.cache }

func (r *resource) Destroy()              {}
func (r *resource) NamespaceScoped() bool { return true }
func (r *resource) Kind() string          { return r.kind }
func (r *resource) Categories() []string  { return []string{"coder"} }

// backendSource lists one backend's objects for the watch cache.
type backendSource struct {
	r *resource
	t target
}

func (b backendSource) Key() string { return b.t.Key() }
func (b backendSource) List(ctx context.Context) ([]watchcache.Object, error) {
	return b.r.listBackend(ctx, b.t)
}

func (r *resource) sources(ctx context.Context) ([]watchcache.Source, error) {
	ts, err := r.targets(ctx, "")
	if err != nil {
		return nil, err
	}
	if r.sourcesListed != nil {
		r.sourcesListed(ts)
	}
	out := make([]watchcache.Source, len(ts))
	for i, t := range ts {
		out[i] = backendSource{r: r, t: t}
	}
	return out, nil
}

// list returns the objects of the request's namespace (or of every
// namespace) that match its selectors, as the cache holds them (shared:
// read only), and the list resourceVersion. What the caller is not shown
// and why (no Coder user in a backend, a coderd that is down) goes into
// Warning headers.
func (r *resource) list(ctx context.Context, opts *metainternalversion.ListOptions) ([]watchcache.Listed, string, error) {
	ns := namespaceOf(ctx)
	ts, err := r.targets(ctx, ns)
	if err != nil {
		return nil, "", err
	}
	var warn warnings
	defer warn.send(ctx)
	all := ns == ""
	v, ts, err := r.viewerOf(ctx, ts, all, &warn)
	if err != nil {
		return nil, "", err
	}
	lts := make([]target, len(ts))
	for i, t := range ts {
		if r.callerLists {
			lts[i] = t.acting()
		} else {
			lts[i] = t
			lts[i].caller = nil
		}
	}
	l := lister{cache: r.cache, maxAge: 2 * r.interval, list: r.listBackend, allNamespaces: all, warn: &warn, resource: r.gr.Resource,
		mapErr: func(t target, err error) error { return r.coderErr(t, err, "") }, probe: r.probe}
	objs, err := l.listTargets(ctx, lts, opts)
	if err != nil {
		return nil, "", err
	}
	if objs, err = r.filterListed(ctx, v, objs, all, &warn); err != nil {
		return nil, "", err
	}
	sel := selectorOf(opts)
	if sel.empty() {
		return objs, r.cache.ResourceVersion(), nil
	}
	out := objs[:0]
	for _, o := range objs {
		if sel.matches(r.selectable(o.Obj)) {
			out = append(out, o)
		}
	}
	return out, r.cache.ResourceVersion(), nil
}

// Watch streams changes from the shared poller, of the backends the
// caller may read (what a list would answer them), with the same
// warnings.
func (r *resource) Watch(ctx context.Context, opts *metainternalversion.ListOptions) (watch.Interface, error) {
	sel := selectorOf(opts)
	var match func(watchcache.Object) bool
	if !sel.empty() {
		match = func(o watchcache.Object) bool { return sel.matches(r.selectable(o)) }
	}
	ns := namespaceOf(ctx)
	ts, err := r.targets(ctx, ns)
	if err != nil {
		return nil, err
	}
	var warn warnings
	defer warn.send(ctx)
	all := ns == ""
	v, ts, err := r.viewerOf(ctx, ts, all, &warn)
	if err != nil {
		return nil, err
	}
	// Only the backends the caller was admitted to: a refused backend's
	// objects never reach the watch, filtered or not.
	keys := make(map[string]bool, len(ts))
	for _, t := range ts {
		keys[t.Key()] = true
	}
	covers := func(key string) bool { return keys[key] }
	if err := r.refreshForWatch(ctx, ts, opts, all, &warn); err != nil {
		return nil, err
	}
	w, err := r.cache.Watch(ctx, watchOptions(opts, covers, match))
	if err != nil {
		return nil, err
	}
	return r.filterWatch(ctx, v, w), nil
}

// targets returns the backends serving namespace ("" = every namespace).
func (r *resource) targets(ctx context.Context, namespace string) ([]target, error) {
	bs, err := r.backends.Backends(ctx, namespace)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("find the control planes of namespace %q: %v", namespace, err))
	}
	return targetsOf(bs), nil
}

// resolve finds the backend an object name of namespace refers to.
// controlPlane is the name's prefix, empty when it has none.
func (r *resource) resolve(ctx context.Context, namespace, controlPlane, name string) (target, error) {
	ts, err := r.targets(ctx, namespace)
	if err != nil {
		return target{}, err
	}
	switch {
	case len(ts) == 0:
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has no CoderControlPlane with ready operator access", namespace))
	case controlPlane == "" && len(ts) == 1:
		return ts[0], nil
	case controlPlane == "":
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has several control planes (%s): prefix the name with the control plane's name", namespace, controlPlaneNames(ts)))
	case len(ts) == 1:
		return target{}, r.notFound(name, fmt.Sprintf("namespace %q has one control plane: name the object without the %q prefix", namespace, controlPlane))
	}
	for _, t := range ts {
		if t.ControlPlane == controlPlane {
			return t, nil
		}
	}
	return target{}, r.notFound(name, fmt.Sprintf("namespace %q has no control plane %q with ready operator access (it has %s)", namespace, controlPlane, controlPlaneNames(ts)))
}

func controlPlaneNames(ts []target) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.ControlPlane
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// notFound is a NotFound status whose message says why.
func (r *resource) notFound(name, why string) error {
	err := apierrors.NewNotFound(r.gr, name)
	err.ErrStatus.Message = fmt.Sprintf("%s: %s", err.ErrStatus.Message, why)
	return err
}

// badName is the NotFound a malformed name gets on reads: no object can
// have that name.
func (r *resource) badName(name string, err error) error {
	return r.notFound(name, err.Error())
}

// coderErr turns an error from t's coderd into a Kubernetes status that
// names the control plane (or the static backend) in its hints.
func (r *resource) coderErr(t target, err error, name string) error {
	tgt := coderstatus.Target{Resource: r.gr, Kind: r.kind, Name: name, Fields: r.fields, StaticBackend: t.ControlPlane == ""}
	if t.URL != nil {
		tgt.CoderURL = t.URL.String()
	}
	if t.ControlPlane != "" {
		tgt.ControlPlane = t.Namespace + "/" + t.ControlPlane
	}
	return coderstatus.Error(err, tgt)
}

// createErr is coderErr for a create: a 409 means the object exists.
func (r *resource) createErr(t target, err error, name string) error {
	se := r.coderErr(t, err, name)
	if coderapi.StatusCode(err) == http.StatusConflict {
		return apierrors.NewAlreadyExists(r.gr, name)
	}
	return se
}

// conflict is the 409 a stale resourceVersion gets.
func (r *resource) conflict(name string) error {
	return apierrors.NewConflict(r.gr, name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
}

// checkPreconditions applies optimistic concurrency: the caller's
// resourceVersion must describe the content coderd has now.
func (r *resource) checkResourceVersion(name, given, current string) error {
	if given == "" || watchcache.SameContent(given, current) {
		return nil
	}
	return r.conflict(name)
}

func namespaceOf(ctx context.Context) string {
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return ns
}

// inNamespace selects the watch cache keys of namespace ("" = all).
func inNamespace(namespace string) func(key string) bool {
	if namespace == "" {
		return nil
	}
	prefix := namespace + "/"
	return func(key string) bool { return strings.HasPrefix(key, prefix) }
}

// selector is a list or watch request's label and field selectors.
type selector struct {
	labels labels.Selector
	fields fields.Selector
}

func selectorOf(opts *metainternalversion.ListOptions) selector {
	s := selector{labels: labels.Everything(), fields: fields.Everything()}
	if opts != nil && opts.LabelSelector != nil {
		s.labels = opts.LabelSelector
	}
	if opts != nil && opts.FieldSelector != nil {
		s.fields = opts.FieldSelector
	}
	return s
}

func (s selector) empty() bool { return s.labels.Empty() && s.fields.Empty() }

func (s selector) matches(l map[string]string, f fields.Set) bool {
	return s.labels.Matches(labels.Set(l)) && s.fields.Matches(f)
}

func isDryRun(dryRun []string) bool { return len(dryRun) > 0 }

// checkDeletePreconditions honours DeleteOptions.Preconditions.
func (r *resource) checkDeletePreconditions(name string, cur metav1.Object, opts *metav1.DeleteOptions) error {
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

// updatedObject is what an update request asks for: objInfo applied to a
// copy of cur, whose resourceVersion (if given) must still describe cur. When the object does not exist (readErr is NotFound) and
// forceAllowCreate is set, as for server-side apply's create-on-apply, it
// creates the object from objInfo applied to empty and returns the result
// as created.
func updatedObject[T object](ctx context.Context, r *resource, name string, cur T, readErr error, objInfo rest.UpdatedObjectInfo,
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
