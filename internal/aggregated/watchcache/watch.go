package watchcache

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/clock"
)

// WatchOptions selects where a watch starts and what it sees.
type WatchOptions struct {
	// ResourceVersion is "" or "0" to start from the current state, or a
	// list/object resourceVersion to resume after.
	ResourceVersion string
	// SendInitialEvents follows Kubernetes streaming-list semantics.
	SendInitialEvents *bool
	// AllowBookmarks enables periodic BOOKMARK events.
	AllowBookmarks bool
	// Backend picks the backends this watcher sees (nil = all).
	Backend func(key string) bool
	// Match is the label/field selector predicate (nil = all).
	//
	// Both run with the cache locked, on every change: they must be fast,
	// must not modify the object and must not call into the Cache or the
	// watch.
	Match func(Object) bool
}

// item is one pending delivery to a watcher, already filtered.
type item struct {
	typ watch.EventType
	// obj is a stored, immutable object; it is deep-copied on delivery.
	// Nil for bookmarks.
	obj Object
	// rv, when set, replaces obj's resourceVersion (selector transitions to
	// DELETED) or is the bookmark's version.
	rv         string
	initialEnd bool
}

// fifo is a slice-backed queue that releases references as it drains.
type fifo struct {
	items []item
	head  int
}

func (q *fifo) push(it item) { q.items = append(q.items, it) }

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) pop() (item, bool) {
	if q.head == len(q.items) {
		return item{}, false
	}
	it := q.items[q.head]
	q.items[q.head] = item{}
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return it, true
}

type watcher struct {
	c         *Cache
	backend   func(string) bool
	match     func(Object) bool
	bookmarks bool
	result    chan watch.Event
	// notify wakes the goroutine when items arrive.
	notify chan struct{}
	// done is closed by Stop or by the cache on overflow.
	done     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}

	mu sync.Mutex
	// initial holds the synthetic initial state or the replayed history;
	// it is not bounded because it was sized by the cache, not by a
	// consumer falling behind.
	initial fifo
	// live holds events dispatched after the watch started; bounded.
	live fifo
	// seq is the cache's lastSeq as of the last dispatch to this watcher;
	// once the queues are empty every event up to it has been delivered
	// or filtered out, so it is a safe bookmark version.
	seq uint64
}

var _ watch.Interface = (*watcher)(nil)

// Watch starts a watch. Semantics follow the Kubernetes watch cache:
//
//   - ResourceVersion "" or "0", SendInitialEvents nil: ADDED for every
//     current matching object, then live changes.
//   - ResourceVersion X: every change after X, then live changes. X older
//     than the retained history fails with 410 Expired, and so does an X
//     this cache did not issue (another replica's, an earlier process's,
//     the previous format's, or not a resourceVersion at all) or one newer
//     than its latest change: the client lists again.
//   - SendInitialEvents true: ADDED for every current matching object
//     whatever the ResourceVersion (the caller ensures freshness first),
//     then, with AllowBookmarks, one BOOKMARK with the list resourceVersion
//     and the k8s.io/initial-events-end annotation, then live changes.
//     SendInitialEvents false: like nil, except that "" or "0" start from
//     now without initial events.
//
// An object that stops matching is delivered as DELETED (its previous
// content with the new version) and one that starts matching as ADDED.
//
// A watcher never blocks the cache or other watchers: if it still has
// WatcherBuffer undelivered live events when another change arrives, it is
// terminated and its result channel closed, so the client re-watches from
// the last version it received. With AllowBookmarks a BOOKMARK is sent every
// BookmarkInterval. Stop or cancelling ctx ends the watch.
func (c *Cache) Watch(ctx context.Context, opts WatchOptions) (watch.Interface, error) {
	sendInitial := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	fromNow := opts.ResourceVersion == "" || opts.ResourceVersion == "0"

	w := &watcher{
		c:         c,
		backend:   opts.Backend,
		match:     opts.Match,
		bookmarks: opts.AllowBookmarks,
		result:    make(chan watch.Event),
		notify:    make(chan struct{}, 1),
		done:      make(chan struct{}),
		exited:    make(chan struct{}),
	}

	c.mu.Lock()
	switch {
	case sendInitial || (fromNow && opts.SendInitialEvents == nil):
		for _, o := range c.objectsLocked(opts.Backend) {
			if w.matches(o) {
				w.initial.push(item{typ: watch.Added, obj: o})
			}
		}
		// kube-apiserver's handler turns a legacy watch from "" or "0"
		// into sendInitialEvents=true without bookmarks; those clients get
		// the initial events but no bookmark, as from kube-apiserver.
		if sendInitial && opts.AllowBookmarks {
			w.initial.push(item{typ: watch.Bookmark, rv: c.listRV(c.lastSeq), initialEnd: true})
		}
	case fromNow:
		// sendInitialEvents=false: nothing to replay.
	default:
		// Never "now" for a version this cache cannot place: the
		// client would miss what happened after it (see the package
		// doc).
		fromSeq, err := c.ownSeqLocked(opts.ResourceVersion)
		if err == nil && fromSeq < c.droppedSeq {
			err = apierrors.NewResourceExpired(fmt.Sprintf(
				"too old resource version: %s (oldest retained %s)", opts.ResourceVersion, c.listRV(c.droppedSeq)))
		}
		if err != nil {
			c.mu.Unlock()
			return nil, err
		}
		for _, ev := range c.history.since(fromSeq) {
			if it, ok := w.translate(ev); ok {
				w.initial.push(it)
			}
		}
	}
	w.seq = c.lastSeq
	c.watchers[w] = struct{}{}
	if len(c.watchers) == 1 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()

	go w.run(ctx)
	return w, nil
}

func (w *watcher) matches(o Object) bool {
	return w.match == nil || w.match(o)
}

// translate turns a change into what this watcher must see, if anything.
func (w *watcher) translate(ev *event) (item, bool) {
	if w.backend != nil && !w.backend(ev.key) {
		return item{}, false
	}
	switch ev.typ {
	case watch.Modified:
		cur, old := w.matches(ev.obj), w.matches(ev.prev)
		switch {
		case cur && old:
			return item{typ: watch.Modified, obj: ev.obj}, true
		case cur:
			return item{typ: watch.Added, obj: ev.obj}, true
		case old:
			return item{typ: watch.Deleted, obj: ev.prev, rv: w.c.objectRV(ev.seq, ev.prevFP)}, true
		}
		return item{}, false
	default:
		if w.matches(ev.obj) {
			return item{typ: ev.typ, obj: ev.obj}, true
		}
		return item{}, false
	}
}

// dispatchLocked queues batch for w, terminating w if it has fallen behind.
// Called with c.mu held.
func (c *Cache) dispatchLocked(w *watcher, batch []*event) {
	var items []item
	for _, ev := range batch {
		if it, ok := w.translate(ev); ok {
			items = append(items, it)
		}
	}
	w.mu.Lock()
	w.seq = c.lastSeq
	if len(items) > 0 && w.live.len() >= c.watcherBuffer {
		w.mu.Unlock()
		c.log.V(1).Info("terminating watcher that fell behind", "pending", c.watcherBuffer)
		delete(c.watchers, w)
		w.terminate()
		return
	}
	for _, it := range items {
		w.live.push(it)
	}
	w.mu.Unlock()
	if len(items) > 0 {
		select {
		case w.notify <- struct{}{}:
		default:
		}
	}
}

// next pops the next pending item, or reports the bookmark version when
// nothing is pending.
func (w *watcher) next() (item, bool, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if it, ok := w.initial.pop(); ok {
		return it, true, 0
	}
	if it, ok := w.live.pop(); ok {
		return it, true, 0
	}
	return item{}, false, w.seq
}

func (w *watcher) run(ctx context.Context) {
	defer close(w.exited)
	defer close(w.result)
	defer w.c.removeWatcher(w)

	var timer clock.Timer
	var tick <-chan time.Time
	if w.bookmarks {
		timer = w.c.clock.NewTimer(w.c.bookmarkInterval)
		defer timer.Stop()
		tick = timer.C()
	}
	bookmarkDue := false
	for {
		it, ok, seq := w.next()
		if !ok && bookmarkDue {
			it, ok = item{typ: watch.Bookmark, rv: w.c.listRV(seq)}, true
			bookmarkDue = false
			timer.Reset(w.c.bookmarkInterval)
		}
		if ok {
			select {
			case w.result <- w.c.toEvent(it):
			case <-w.done:
				return
			case <-ctx.Done():
				return
			}
			continue
		}
		select {
		case <-w.notify:
		case <-tick:
			bookmarkDue = true
		case <-w.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// toEvent builds the delivered event; objects are deep copies so consumers
// may mutate them.
func (c *Cache) toEvent(it item) watch.Event {
	if it.typ == watch.Bookmark {
		o := c.newObject()
		o.SetResourceVersion(it.rv)
		if it.initialEnd {
			o.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		}
		return watch.Event{Type: watch.Bookmark, Object: o}
	}
	o := deepCopy(it.obj)
	if it.rv != "" {
		o.SetResourceVersion(it.rv)
	}
	return watch.Event{Type: it.typ, Object: o}
}

func (c *Cache) removeWatcher(w *watcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.watchers, w)
}

// terminate asks the goroutine to exit without waiting; safe under c.mu.
func (w *watcher) terminate() {
	w.stopOnce.Do(func() { close(w.done) })
}

// Stop ends the watch and waits until its goroutine has released
// everything; ResultChan is closed when it returns.
func (w *watcher) Stop() {
	w.terminate()
	<-w.exited
}

// ResultChan delivers the events; it is closed when the watch ends.
func (w *watcher) ResultChan() <-chan watch.Event {
	return w.result
}
