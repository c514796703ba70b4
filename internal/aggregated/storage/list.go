package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// lister reads the objects of a request's backends, from coderd or the
// watch cache.
type lister struct {
	cache  *watchcache.Cache
	maxAge time.Duration
	// list reads every object of one backend from coderd.
	list func(context.Context, target) ([]watchcache.Object, error)
	// mapErr turns a backend's error into the request's answer.
	mapErr func(target, error) error
	// allNamespaces: one backend's failure must not fail the request; its
	// objects are answered as last seen, with a warning.
	allNamespaces bool
	warn          *warnings
	resource      string
	// probe, when set, lists a backend known to be failing in the
	// background (see genericStore.probe).
	probe func(target)
}

// listTargets returns the objects of every target, as the cache holds
// them (shared: read only). A list at resourceVersion "0" is served from
// the watch cache for each target synced there recently; any other list
// reads coderd (and refreshes the cache with what it read, so watchers
// see the change too). Across namespaces a target whose coderd is known
// to be failing is not asked, and one that fails is answered from the
// cache: its objects as last seen, never dropped (an informer relisting
// would delete them), with a warning naming the coderd and since when.
//
// A target with a caller (callerLists) is listed as that caller: coderd
// answers only what they may read.
func (l lister) listTargets(ctx context.Context, ts []target, opts *metainternalversion.ListOptions) ([]watchcache.Listed, error) {
	if ok, err := l.servableFromCache(ts, opts); err != nil {
		return nil, err
	} else if ok {
		return l.cached(keysOf(ts)), nil
	}
	fromCache := map[string]bool{}
	var ask []target
	for _, t := range ts {
		fresh := opts != nil && opts.ResourceVersion == "0" && l.fresh(t.Key())
		if out, down := l.cache.Outage(t.Key()); fresh || (down && l.allNamespaces) {
			fromCache[t.Key()] = true
			if down && !fresh {
				l.lastSeen(t, out)
				if l.probe != nil && !time.Now().Before(out.Retry) {
					l.probe(t)
				}
			}
			continue
		}
		ask = append(ask, t)
	}
	results := make([][]watchcache.Listed, len(ask))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	var mu sync.Mutex
	for i, t := range ask {
		g.Go(func() error {
			stamped, err := l.listOne(gctx, t)
			if err != nil && l.allNamespaces && ctx.Err() == nil {
				l.cache.ListFailed(t.Key(), err)
				out, _ := l.cache.Outage(t.Key())
				l.lastSeen(t, out)
				mu.Lock()
				fromCache[t.Key()] = true
				mu.Unlock()
				return nil
			}
			if err != nil {
				return l.mapErr(t, err)
			}
			mu.Lock()
			results[i] = stamped
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := l.cached(fromCache)
	for _, r := range results {
		out = append(out, r...)
	}
	return out, nil
}

// listOne lists one target from coderd and applies the result to the
// cache.
func (l lister) listOne(ctx context.Context, t target) ([]watchcache.Listed, error) {
	start := l.cache.StartList()
	objs, err := l.list(ctx, t)
	l.cache.ListSucceeded(t.Key(), err)
	switch {
	case t.caller != nil && (err == nil || errors.Is(err, watchcache.ErrIncomplete)):
		// What coderd showed the caller: it updates the cache (the same
		// objects the operator would read) and deletes nothing, since the
		// caller sees only part of coderd.
		return l.cache.UpsertListedShared(t.Key(), start, objs...), nil
	case t.caller != nil:
		return nil, err
	case errors.Is(err, watchcache.ErrIncomplete):
		// coderd changed between pages: what was read updates the cache,
		// and the backend's objects are answered from it, which keeps
		// those the pages may have skipped.
		l.cache.UpsertListedShared(t.Key(), start, objs...)
		key := t.Key()
		stamped, _ := l.cache.SnapshotShared(func(k string) bool { return k == key })
		return stamped, nil
	case err != nil:
		return nil, err
	default:
		return l.cache.ReplaceListedShared(t.Key(), start, objs), nil
	}
}

// probe lists t, a backend known to be failing, in the background, at
// most once at a time: lists across namespaces do not wait for it, and
// without a watch open (the poller) nothing else would notice that its
// coderd answers again. Until the resource runs there is no background.
func (r *genericStore) probe(t target) {
	bg := r.bg.Load()
	if bg == nil || (*bg).Err() != nil {
		return
	}
	if _, busy := r.probing.LoadOrStore(t.Key(), true); busy {
		return
	}
	t.caller = nil
	l := lister{cache: r.cache, list: r.listBackend}
	r.probes.Go(func() {
		defer r.probing.Delete(t.Key())
		if _, err := l.listOne(*bg, t); err != nil && (*bg).Err() == nil {
			r.cache.ListFailed(t.Key(), err)
		}
	})
}

// lastSeen warns that t's objects are answered as the cache last saw
// them.
func (l lister) lastSeen(t target, out watchcache.Outage) {
	what := "its " + l.resource + " are shown as last seen"
	if !l.cache.Synced(t.Key()) {
		what = "none of its " + l.resource + " have been read yet"
	}
	l.warn.add(outageReason(t, out), what)
}

// outageReason says which coderd fails, since when and how.
func outageReason(t target, out watchcache.Outage) string {
	why := fmt.Sprintf("the coderd of %s is unreachable", t.describe())
	if !out.Since.IsZero() {
		why += " since " + out.Since.UTC().Format(time.RFC3339)
	}
	if out.Last != nil {
		why += ": " + out.Last.Error()
	}
	return why
}

// cached returns the cache's objects of the backends in keys.
func (l lister) cached(keys map[string]bool) []watchcache.Listed {
	if len(keys) == 0 {
		return nil
	}
	objs, _ := l.cache.SnapshotShared(func(k string) bool { return keys[k] })
	return objs
}

func keysOf(ts []target) map[string]bool {
	keys := make(map[string]bool, len(ts))
	for _, t := range ts {
		keys[t.Key()] = true
	}
	return keys
}

// servableFromCache reports whether a list at a resourceVersion may be
// answered wholly from the cache, or returns the 410 Expired a list with
// resourceVersionMatch=Exact gets when the cache cannot answer it (the
// client lists again without it).
//
// "Not older than" X (what the next page of a paged list asks for) is
// answered from the cache when X is a version it issued and every target
// is synced and fresh; a fresh cache is newer than X. A version of
// another replica or process says nothing about this cache's state, so
// that list reads coderd, a consistent read: never older than what the
// client already saw. Exact X is answered from the cache only at its
// latest version, with every target synced.
func (l lister) servableFromCache(ts []target, opts *metainternalversion.ListOptions) (bool, error) {
	if opts == nil || opts.ResourceVersion == "" || opts.ResourceVersion == "0" {
		return false, nil
	}
	switch opts.ResourceVersionMatch {
	case metav1.ResourceVersionMatchExact:
		if err := l.cache.CheckExact(opts.ResourceVersion); err != nil {
			return false, err
		}
		for _, t := range ts {
			if !l.cache.Synced(t.Key()) {
				return false, apierrors.NewResourceExpired(fmt.Sprintf(
					"resourceVersion %s: the state of %s at that version is not held here; list again without resourceVersionMatch=Exact", opts.ResourceVersion, t.describe()))
			}
		}
		return true, nil
	case "", metav1.ResourceVersionMatchNotOlderThan:
		if !l.cache.Issued(opts.ResourceVersion) {
			return false, nil
		}
		for _, t := range ts {
			if !l.fresh(t.Key()) {
				return false, nil
			}
		}
		return true, nil
	}
	return false, nil
}

// fresh reports whether the cache holds the backend's state as read
// within maxAge (the poller, while someone watches, keeps it so): what a
// list at resourceVersion "0" may be answered with.
func (l lister) fresh(key string) bool {
	return l.cache.Synced(key) && time.Since(l.cache.LastReplaced(key)) <= l.maxAge
}

// watchOptions are the watch cache's options for a watch request.
func watchOptions(opts *metainternalversion.ListOptions, covers func(string) bool, match func(watchcache.Object) bool) watchcache.WatchOptions {
	wo := watchcache.WatchOptions{Backend: covers, Match: match}
	if opts != nil {
		wo.ResourceVersion = opts.ResourceVersion
		wo.SendInitialEvents = opts.SendInitialEvents
		wo.AllowBookmarks = opts.AllowWatchBookmarks
	}
	return wo
}

// refreshForWatch makes a watch that starts from "now" with the current
// state first read coderd, so its initial events are as fresh as a list.
// It waits only for the watch's backends; across namespaces not for those
// known to be failing, and one that fails is answered as last seen with a
// warning. Otherwise a failure answers 503 and the client retries.
func (r *genericStore) refreshForWatch(ctx context.Context, ts []target, opts *metainternalversion.ListOptions, allNamespaces bool, warn *warnings) error {
	wo := watchOptions(opts, nil, nil)
	consistent := wo.ResourceVersion == "" || (wo.SendInitialEvents != nil && *wo.SendInitialEvents &&
		(opts.ResourceVersionMatch == "" || opts.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan) && wo.ResourceVersion != "0")
	if !consistent {
		return nil
	}
	l := lister{cache: r.cache, allNamespaces: allNamespaces, warn: warn, resource: r.gr.Resource}
	wait := map[string]target{}
	for _, t := range ts {
		if out, down := r.cache.Outage(t.Key()); down && allNamespaces {
			l.lastSeen(t, out)
			continue
		}
		wait[t.Key()] = t
	}
	if len(wait) == 0 {
		return nil
	}
	err := r.cache.RefreshBackends(ctx, func(key string) bool { _, ok := wait[key]; return ok })
	var be *watchcache.BackendErrors
	if !errors.As(err, &be) {
		if err != nil {
			return apierrors.NewServiceUnavailable("read the current state from coderd: " + err.Error())
		}
		return nil
	}
	for key, e := range be.Errs {
		if !allNamespaces || ctx.Err() != nil {
			return apierrors.NewServiceUnavailable("read the current state from coderd: " + e.Error())
		}
		out, _ := r.cache.Outage(key)
		if out.Last == nil {
			out.Last = e
		}
		l.lastSeen(wait[key], out)
	}
	return nil
}
