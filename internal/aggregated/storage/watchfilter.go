package storage

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// A new watch's initial events arrive back to back; the filter gathers
// those that follow within batchWait of each other (at most maxBatch) and
// asks coderd about them together, so that N objects cost about N/10
// authorization checks rather than N. The wait also delays each live
// event by that much, against polls seconds apart.
const (
	batchWait = 10 * time.Millisecond
	maxBatch  = 500
)

// filterWatch passes on to a viewer the events of the objects they may
// read, without the restricted fields of those whose fields they may not
// see (DELETED included), typed as a watch of just those objects would
// type them: ADDED for an object the watcher does not hold, MODIFIED for
// one it holds, DELETED when it goes or stops being readable.
func (r *genericStore) filterWatch(ctx context.Context, cs callers, in watch.Interface, allNamespaces bool) watch.Interface {
	if len(cs) == 0 {
		return in
	}
	fw := &filteredWatch{in: in, out: make(chan watch.Event), done: make(chan struct{}), r: r, cs: cs, allNamespaces: allNamespaces, holds: map[types.UID]bool{}}
	go fw.run(ctx)
	return fw
}

type filteredWatch struct {
	in   watch.Interface
	out  chan watch.Event
	done chan struct{}
	stop sync.Once

	r  *genericStore
	cs callers
	// allNamespaces: the watch spans namespaces (see shownTo).
	allNamespaces bool
	// holds records, per object the watcher has been told of, whether it
	// holds it now (was last sent it as ADDED or MODIFIED). Objects the
	// watch has not seen are those the client listed before watching:
	// they count as held when readable.
	holds map[types.UID]bool
}

func (w *filteredWatch) Stop() {
	w.stop.Do(func() {
		close(w.done)
		w.in.Stop()
	})
}

func (w *filteredWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *filteredWatch) run(ctx context.Context) {
	defer close(w.out)
	defer w.in.Stop()
	timer := time.NewTimer(batchWait)
	defer timer.Stop()
	for {
		batch, open := w.gather(ctx, timer)
		if len(batch) > 0 && !w.deliver(ctx, batch) {
			return
		}
		if !open {
			return
		}
	}
}

// gather waits for an event, then takes those that follow closely; it
// reports false once the input has ended (or the watch stopped).
func (w *filteredWatch) gather(ctx context.Context, timer *time.Timer) ([]watch.Event, bool) {
	var batch []watch.Event
	for len(batch) < maxBatch {
		var wait <-chan time.Time
		if len(batch) > 0 {
			timer.Reset(batchWait)
			wait = timer.C
		}
		select {
		case ev, ok := <-w.in.ResultChan():
			if !ok {
				return batch, false
			}
			batch = append(batch, ev)
			if _, isObj := objectOf(ev); !isObj {
				// Bookmarks and errors keep their place in the stream.
				return batch, true
			}
		case <-wait:
			return batch, true
		case <-w.done:
			return nil, false
		case <-ctx.Done():
			return nil, false
		}
	}
	return batch, true
}

// objectOf returns the object of an ADDED, MODIFIED or DELETED event.
func objectOf(ev watch.Event) (watchcache.Object, bool) {
	if ev.Type == watch.Bookmark || ev.Type == watch.Error {
		return nil, false
	}
	o, ok := ev.Object.(watchcache.Object)
	return o, ok
}

// deliver sends what the viewer sees of batch; false once the watch ends.
func (w *filteredWatch) deliver(ctx context.Context, batch []watch.Event) bool {
	var objs []watchcache.Object
	for _, ev := range batch {
		if o, ok := objectOf(ev); ok {
			objs = append(objs, o)
		}
	}
	var d shown
	if len(objs) > 0 {
		d = w.r.shownTo(ctx, w.cs, objs, w.allNamespaces)
		for _, err := range d.failed {
			// The client relists, and the list says which coderd failed.
			w.send(ctx, watch.Event{Type: watch.Error, Object: &apierrors.NewServiceUnavailable("ask coderd what the caller may read: " + err.Error()).ErrStatus})
			return false
		}
	}
	i := 0
	for _, ev := range batch {
		o, ok := objectOf(ev)
		if !ok {
			if !w.send(ctx, ev) {
				return false
			}
			continue
		}
		out, send := w.translate(ev, o, d.read[i], d.full[i])
		i++
		if send && !w.send(ctx, out) {
			return false
		}
	}
	return true
}

// translate types ev for the viewer, who may now read o (readable) and
// see its restricted fields (full).
func (w *filteredWatch) translate(ev watch.Event, o watchcache.Object, readable, full bool) (watch.Event, bool) {
	uid := o.GetUID()
	held, seen := w.holds[uid]
	if !seen {
		// Not seen on this watch: a new object is not held; one the
		// client listed before watching is held if readable then, which
		// is taken to be as readable now.
		held = ev.Type != watch.Added && readable
	}
	var typ watch.EventType
	switch {
	case ev.Type == watch.Deleted || !readable:
		if !held {
			delete(w.holds, uid)
			return ev, false
		}
		typ = watch.Deleted
		delete(w.holds, uid)
	case held:
		typ = watch.Modified
		w.holds[uid] = true
	default:
		typ = watch.Added
		w.holds[uid] = true
	}
	out := watch.Event{Type: typ, Object: ev.Object}
	if !full {
		out.Object = w.r.access.redact(o)
	}
	return out, true
}

func (w *filteredWatch) send(ctx context.Context, ev watch.Event) bool {
	select {
	case w.out <- ev:
		return true
	case <-w.done:
	case <-ctx.Done():
	}
	return false
}
