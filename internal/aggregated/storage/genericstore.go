// Package storage holds the REST storage of the aggregated API's
// resources, coderworkspaces, codertemplates and codertemplateversions: each request is served by
// calling the coderd of the namespace's control plane, and a shared watch
// cache turns coderd's state into watch events.
package storage

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
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
	// Kube reads the pods and events of workspaces for a GET, and creates
	// the SubjectAccessReviews that say whether the caller may read them
	// (workspace_pods.go); nil: no pod is looked at.
	Kube SecretReader
}

// genericStore is what both kinds' storages share, as k8s.io/apiserver's
// genericregistry.Store is (each storage embeds it and is its kind's
// strategy, registry.go): the backends, the watch cache fed by the
// shared poller, and list, watch and the discovery facts.
type genericStore struct {
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
	// recordMerged, when set, is called by onRecordChange with the
	// record it merged, before it stores the merge (tests).
	recordMerged func(*records.Record)

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
// objects' labels and selectFields. r must be the genericStore inside its
// storage: the cache keeps r.sources.
func startCache[T any, PT interface {
	*T
	watchcache.Object
}](r *genericStore, o Options, list func(context.Context, target) ([]watchcache.Object, error), selectFields func(PT) fields.Set) error {
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
func (r *genericStore) Run(ctx context.Context) {
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
func (r *genericStore) Cache() *watchcache.Cache { return r.cache }

func (r *genericStore) Destroy()              {}
func (r *genericStore) NamespaceScoped() bool { return true }
func (r *genericStore) Kind() string          { return r.kind }
func (r *genericStore) Categories() []string  { return []string{"coder"} }

// backendSource lists one backend's objects for the watch cache.
type backendSource struct {
	r *genericStore
	t target
}

func (b backendSource) Key() string { return b.t.Key() }
func (b backendSource) List(ctx context.Context) ([]watchcache.Object, error) {
	return b.r.listBackend(context.WithValue(ctx, pollKey{}, true), b.t)
}

// pollKey marks the context of the watch cache's own reads (polls, and
// the refresh a watch starts with).
type pollKey struct{}

// polling reports whether ctx is a read of the watch cache: it reads
// everything from coderd, whatever a LIST may reuse, so that watches see
// every change at the next poll.
func polling(ctx context.Context) bool {
	p, _ := ctx.Value(pollKey{}).(bool)
	return p
}

func (r *genericStore) sources(ctx context.Context) ([]watchcache.Source, error) {
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
func (r *genericStore) list(ctx context.Context, opts *metainternalversion.ListOptions) ([]watchcache.Listed, string, error) {
	ns := namespaceOf(ctx)
	ts, err := r.targets(ctx, ns)
	if err != nil {
		return nil, "", err
	}
	var warn warnings
	defer warn.send(ctx)
	all := ns == ""
	cs, ts, err := r.callersOf(ctx, ts, all, &warn)
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
	if objs, err = r.filterListed(ctx, cs, objs, all, &warn); err != nil {
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
func (r *genericStore) Watch(ctx context.Context, opts *metainternalversion.ListOptions) (watch.Interface, error) {
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
	cs, ts, err := r.callersOf(ctx, ts, all, &warn)
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
	return r.filterWatch(ctx, cs, w, all, opts), nil
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
