package storage

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/identity"
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
// one it holds, DELETED when it goes or stops being readable. On a
// resumed watch an object it has not sent counts as held only as far as
// wasReadable can tell (docs/security.md says what that leaves out).
func (r *genericStore) filterWatch(ctx context.Context, cs callers, in watch.Interface, allNamespaces bool, opts *metainternalversion.ListOptions) watch.Interface {
	if len(cs) == 0 {
		return in
	}
	fw := &filteredWatch{in: in, out: make(chan watch.Event), done: make(chan struct{}), r: r, cs: cs, allNamespaces: allNamespaces,
		initial: startsWithState(opts), holds: map[types.UID]bool{}}
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
	// initial: the watch starts with ADDED events of the current state,
	// so the client holds only what this watch sent.
	initial bool
	// holds records, per object the watcher has been told of, whether it
	// holds it now (was last sent it as ADDED or MODIFIED). On a watch
	// without initial events, objects it has not seen are those the
	// client listed before watching: they count as held when readable, or
	// when coderd last told the caller they could read it (wasReadable).
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

// startsWithState says whether a watch with opts starts with ADDED
// events of every current object, as the watch cache serves it.
func startsWithState(opts *metainternalversion.ListOptions) bool {
	wo := watchOptions(opts, nil, nil)
	if wo.SendInitialEvents != nil {
		return *wo.SendInitialEvents
	}
	return wo.ResourceVersion == "" || wo.ResourceVersion == "0"
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
	// Before shownTo asks coderd, which replaces the answers remembered.
	was := make([]bool, len(objs))
	for i, o := range objs {
		if _, seen := w.holds[o.GetUID()]; !seen && !w.initial {
			was[i] = w.wasReadable(o)
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
		out, send := w.translate(ev, o, d.read[i] || was[i], d.read[i], d.full[i])
		i++
		if send && !w.send(ctx, out) {
			return false
		}
	}
	return true
}

// translate types ev for the viewer, who may now read o (readable) and
// see its restricted fields (full); listable says whether a list before
// this watch showed o to them, as far as can be told (see wasReadable).
func (w *filteredWatch) translate(ev watch.Event, o watchcache.Object, listable, readable, full bool) (watch.Event, bool) {
	uid := o.GetUID()
	held, seen := w.holds[uid]
	if !seen {
		// Not seen on this watch: a new object is not held, nor is any
		// after initial events; one the client listed before watching is
		// held if it was listable.
		held = !w.initial && ev.Type != watch.Added && listable
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

// wasReadable says whether coderd's last remembered answer for the
// caller let them read o at a time o existed: then an earlier list may
// have shown it, and a DELETED tells them nothing they were not allowed
// to know. Without such an answer (none asked in this process in the
// last hour, or the last one a refusal) an object the caller may not read
// now is not reported, even if their list held it: a DELETED for every
// unreadable object would reveal the names of objects they may never
// read.
func (w *filteredWatch) wasReadable(o watchcache.Object) bool {
	c := w.cs[backendKey(o)]
	if c == nil || c.ClusterController {
		return false // they read every object, so never lose one
	}
	oc, ok := w.r.access.checks(o)
	if !ok {
		return false
	}
	// Strictly after the creation time, which has whole seconds.
	existed := o.GetCreationTimestamp().Add(time.Second)
	checks := []identity.Check{oc.read}
	if oc.readAll != nil {
		checks = append(checks, *oc.readAll)
	}
	for _, ch := range checks {
		if at, ok := c.AllowedAt(ch); ok && !at.Before(existed) {
			return true
		}
	}
	return false
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
