package storage

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// listTargets returns the objects of every target, as the cache holds
// them (shared: read only). A list at
// resourceVersion "0" may be served from the watch cache when every target
// is synced there; any other list reads coderd (and refreshes the cache
// with what it read, so watchers see the change too).
//
// A target with a caller (callerLists) is listed as that caller: coderd
// answers only what they may read.
//
// An error is mapped by mapErr with the target it came from.
func listTargets(ctx context.Context, cache *watchcache.Cache, maxAge time.Duration, ts []target, opts *metainternalversion.ListOptions,
	list func(context.Context, target) ([]watchcache.Object, error), mapErr func(target, error) error) ([]watchcache.Listed, error) {
	if servableFromCache(cache, ts, opts, maxAge) {
		keys := make(map[string]bool, len(ts))
		for _, t := range ts {
			keys[t.Key()] = true
		}
		objs, _ := cache.SnapshotShared(func(k string) bool { return keys[k] })
		return objs, nil
	}
	results := make([][]watchcache.Listed, len(ts))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	var mu sync.Mutex
	for i, t := range ts {
		g.Go(func() error {
			start := cache.StartList()
			objs, err := list(gctx, t)
			var stamped []watchcache.Listed
			switch {
			case t.caller != nil && (err == nil || errors.Is(err, watchcache.ErrIncomplete)):
				// What coderd showed the caller: it updates the cache
				// (the same objects the operator would read) and deletes
				// nothing, since the caller sees only part of coderd.
				stamped = cache.UpsertShared(t.Key(), objs...)
			case t.caller != nil:
				return mapErr(t, err)
			case errors.Is(err, watchcache.ErrIncomplete):
				// coderd changed between pages: what was read updates the
				// cache, and the backend's objects are answered from it,
				// which keeps those the pages may have skipped.
				cache.Upsert(t.Key(), objs...)
				key := t.Key()
				stamped, _ = cache.SnapshotShared(func(k string) bool { return k == key })
			case err != nil:
				return mapErr(t, err)
			default:
				stamped = cache.ReplaceListedShared(t.Key(), start, objs)
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
	var out []watchcache.Listed
	for _, r := range results {
		out = append(out, r...)
	}
	return out, nil
}

// servableFromCache reports whether a list may be answered from the cache:
// resourceVersion "0" (any state) when the cache is fresh, or a
// resourceVersion the cache has reached, with "not older than" semantics
// (what the next page of a paged list asks for).
func servableFromCache(cache *watchcache.Cache, ts []target, opts *metainternalversion.ListOptions, maxAge time.Duration) bool {
	if opts == nil || opts.ResourceVersion == "" {
		return false
	}
	if opts.ResourceVersion == "0" {
		return cachedFresh(cache, ts, maxAge)
	}
	if opts.ResourceVersionMatch != "" && opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
		return false
	}
	want, err := watchcache.ParseResourceVersion(opts.ResourceVersion)
	if err != nil {
		return false
	}
	have, err := watchcache.ParseResourceVersion(cache.ResourceVersion())
	if err != nil || have < want {
		return false
	}
	for _, t := range ts {
		if !cache.Synced(t.Key()) {
			return false
		}
	}
	return true
}

// cachedFresh reports whether the cache holds every target's state as read
// within maxAge (the poller, while someone watches, keeps it so).
func cachedFresh(cache *watchcache.Cache, ts []target, maxAge time.Duration) bool {
	for _, t := range ts {
		if !cache.Synced(t.Key()) || time.Since(cache.LastReplaced(t.Key())) > maxAge {
			return false
		}
	}
	return true
}

// watchFrom opens a watch on the cache for the backends given. A watch
// that starts from "now" with the current state first reads coderd, so its
// initial events are as fresh as a list; when coderd cannot be reached the
// client retries.
func watchFrom(ctx context.Context, cache *watchcache.Cache, backends func(key string) bool, opts *metainternalversion.ListOptions, match func(watchcache.Object) bool) (watch.Interface, error) {
	wo := watchcache.WatchOptions{Backend: backends, Match: match}
	if opts != nil {
		wo.ResourceVersion = opts.ResourceVersion
		wo.SendInitialEvents = opts.SendInitialEvents
		wo.AllowBookmarks = opts.AllowWatchBookmarks
	}
	consistent := wo.ResourceVersion == "" || (wo.SendInitialEvents != nil && *wo.SendInitialEvents &&
		(opts.ResourceVersionMatch == "" || opts.ResourceVersionMatch == metav1.ResourceVersionMatchNotOlderThan) && wo.ResourceVersion != "0")
	if consistent {
		if err := refreshFor(ctx, cache, wo.Backend); err != nil {
			return nil, apierrors.NewServiceUnavailable("read the current state from coderd: " + err.Error())
		}
	}
	return cache.Watch(ctx, wo)
}

// refreshFor polls coderd now and waits only for the backends the watch
// covers, so one slow or unreachable coderd neither delays nor refuses
// watches of other namespaces.
func refreshFor(ctx context.Context, cache *watchcache.Cache, covers func(key string) bool) error {
	err := cache.RefreshBackends(ctx, covers)
	var be *watchcache.BackendErrors
	if errors.As(err, &be) {
		for _, e := range be.Errs {
			return e
		}
	}
	return err
}
