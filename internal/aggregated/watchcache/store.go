package watchcache

// The cache's state and every change to it (the event ring,
// fingerprints, replace, merge, upsert, delete), all under the one lock;
// what reads it is read.go, what feeds it is poller.go.

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/watch"
)

// event is one recorded change. Its objects are immutable.
type event struct {
	typ watch.EventType // Added, Modified or Deleted
	key string
	seq uint64
	// obj is the new state (Added/Modified) or the last known state stamped
	// with the deletion's version (Deleted).
	obj Object
	// prev is the state before a Modified event; watchers need it to turn
	// selector transitions into Added/Deleted.
	prev   Object
	prevFP uint64
}

// ring is a fixed-capacity FIFO of events.
type ring struct {
	buf   []*event
	start int
	n     int
}

func newRing(capacity int) ring {
	return ring{buf: make([]*event, capacity)}
}

// push appends ev and returns the evicted event, if any.
func (r *ring) push(ev *event) *event {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = ev
		r.n++
		return nil
	}
	old := r.buf[r.start]
	r.buf[r.start] = ev
	r.start = (r.start + 1) % len(r.buf)
	return old
}

// since returns the retained events with seq > after, oldest first.
func (r *ring) since(after uint64) []*event {
	// Binary search: seqs increase along the ring.
	i := sort.Search(r.n, func(i int) bool {
		return r.buf[(r.start+i)%len(r.buf)].seq > after
	})
	out := make([]*event, 0, r.n-i)
	for ; i < r.n; i++ {
		out = append(out, r.buf[(r.start+i)%len(r.buf)])
	}
	return out
}

// fingerprint hashes o's content without its resourceVersion. Field
// ownership (managedFields) is content: the aggregated API keeps it, and
// a change of it alone is a change of the object, as in Kubernetes. It
// restores the resourceVersion instead of copying the object; callers
// only pass objects nobody else reads yet.
func fingerprint(o Object) (uint64, error) {
	rv := o.GetResourceVersion()
	o.SetResourceVersion("")
	data, err := json.Marshal(o)
	o.SetResourceVersion(rv)
	if err != nil {
		return 0, fmt.Errorf("encoding %q for its fingerprint: %w", o.GetName(), err)
	}
	h := fnv.New64a()
	_, _ = h.Write(data) // hash.Hash writes never fail
	return h.Sum64() & fpMask, nil
}

// Fingerprint is the content fingerprint the cache stamps into o's
// resourceVersion (see fingerprint; the same caveat applies: o must not
// be read by anyone else meanwhile).
func Fingerprint(o Object) (uint64, error) { return fingerprint(o) }

// fingerprinted is an object handed to the cache with its fingerprint.
type fingerprinted struct {
	Object
	fp   uint64
	held func(stored Object)
}

// WithFingerprint hands o to the cache (as an element of a Source's
// list, or to Replace, ReplaceListed or Upsert) with its fingerprint,
// which the caller remembers from an earlier object of the same content:
// fp must be what Fingerprint returned for that content. The cache then
// does not encode o to compare it with what it holds, which is most of
// the cost of a list that changed nothing. The cache neither modifies nor
// keeps o (it stores a copy when the content changed), so o may be an
// object the caller shares with others.
//
// held, when not nil, is called with the object the cache holds for o's
// name once it holds o's content (the stored copy, or the object it
// already had), so that a caller that remembers o can remember the
// cache's object instead and the content is kept once. It is not called
// when the cache keeps other content (written after the list began).
// The object is immutable and carries the cache's resourceVersion. held
// runs with the cache locked: it must be fast and must not call into the
// Cache.
func WithFingerprint(o Object, fp uint64, held func(stored Object)) Object {
	return &fingerprinted{Object: o, fp: fp, held: held}
}

// Unwrap returns the object WithFingerprint wrapped, or o itself.
func Unwrap(o Object) Object {
	if f, ok := o.(*fingerprinted); ok && f != nil {
		return f.Object
	}
	return o
}

// isNil also catches typed nil pointers, whose methods would panic.
func isNil(o Object) bool {
	if o == nil {
		return true
	}
	v := reflect.ValueOf(o)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// deepCopy copies a stored object. Stored objects were checked on the way in
// (see recordLocked), so the assertion holds for them.
func deepCopy(o Object) Object {
	cp, _ := o.DeepCopyObject().(Object)
	return cp
}

func (c *Cache) backendLocked(key string) *backend {
	b := c.backends[key]
	if b == nil {
		b = &backend{objs: map[string]*entry{}}
		c.backends[key] = b
	}
	return b
}

// prepared is an incoming object with its fingerprint, computed outside the
// lock because JSON encoding dominates the cost of a poll.
type prepared struct {
	obj  Object
	fp   uint64
	held func(stored Object)
}

// prepare fingerprints objs, logging and leaving out unusable ones (nil, no
// name, not JSON-encodable).
func (c *Cache) prepare(key string, objs []Object) []prepared {
	out := make([]prepared, 0, len(objs))
	for _, o := range objs {
		if f, ok := o.(*fingerprinted); ok && f != nil {
			if !isNil(f.Object) && f.GetName() != "" {
				out = append(out, prepared{obj: f.Object, fp: f.fp, held: f.held})
				continue
			}
			o = f.Object // logged below
		}
		if isNil(o) {
			c.log.Error(nil, "ignoring nil object", "backend", key)
			continue
		}
		if o.GetName() == "" {
			c.log.Error(nil, "ignoring object without a name", "backend", key)
			continue
		}
		fp, err := fingerprint(o)
		if err != nil {
			c.log.Error(err, "ignoring object", "backend", key)
			continue
		}
		out = append(out, prepared{obj: o, fp: fp})
	}
	return out
}

// recordLocked stores p if its content differs from the stored object of
// the same name, appending the change to batch. It returns the entry
// that holds the content afterwards (the stored one when unchanged), or
// ok=false when the object's type does not deep-copy to an Object
// (logged).
func (c *Cache) recordLocked(key string, b *backend, p prepared, batch []*event) (*entry, bool, []*event) {
	name := p.obj.GetName()
	old := b.objs[name]
	if old != nil && old.fp == p.fp {
		if p.held != nil {
			p.held(old.obj)
		}
		return old, true, batch
	}
	// The cache stores its own copy, so that callers may hand it objects
	// they share (see WithFingerprint); the copy doubles as the check that
	// the type deep-copies to an Object, which deepCopy relies on later.
	cp, ok := p.obj.DeepCopyObject().(Object)
	if !ok {
		c.log.Error(nil, "ignoring object whose DeepCopyObject does not return an Object", "backend", key, "name", name, "type", fmt.Sprintf("%T", p.obj))
		return nil, false, batch
	}
	seq := c.nextSeqLocked()
	cp.SetResourceVersion(c.objectRV(seq, p.fp))
	e := &entry{obj: cp, fp: p.fp, seq: seq}
	b.objs[name] = e
	if p.held != nil {
		p.held(cp)
	}
	delete(b.deleted, name)
	ev := &event{typ: watch.Added, key: key, seq: seq, obj: cp}
	if old != nil {
		ev.typ = watch.Modified
		ev.prev = old.obj
		ev.prevFP = old.fp
	}
	return e, true, append(batch, ev)
}

// removeLocked forgets name, appending a Deleted event carrying the last
// known object with a new version.
func (c *Cache) removeLocked(key string, b *backend, name string, batch []*event) []*event {
	old := b.objs[name]
	if old == nil {
		return batch
	}
	delete(b.objs, name)
	seq := c.nextSeqLocked()
	gone := deepCopy(old.obj)
	gone.SetResourceVersion(c.objectRV(seq, old.fp))
	return append(batch, &event{typ: watch.Deleted, key: key, seq: seq, obj: gone})
}

// commitLocked appends batch to the history and hands it to the watchers.
func (c *Cache) commitLocked(batch []*event) {
	if len(batch) == 0 {
		return
	}
	for _, ev := range batch {
		if old := c.history.push(ev); old != nil {
			c.droppedSeq = old.seq
		}
	}
	c.events += uint64(len(batch))
	for w := range c.watchers {
		c.dispatchLocked(w, batch)
	}
}

// Replace sets the complete current object set of a backend (a full list):
// new names become ADDED, changed content MODIFIED, missing names DELETED.
// It marks the backend synced. The cache stores copies of objs, which
// nobody else may read during the call (see fingerprint). It returns
// stamped deep copies in the order given; unusable objects (nil, no name,
// not JSON-encodable) are logged and left out, and of duplicate names the
// first wins.
func (c *Cache) Replace(key string, objs []Object) []Object {
	ps := c.prepare(key, objs)
	c.mu.Lock()
	// Everything stored is at most lastSeq, so nothing is protected.
	es := c.replaceLocked(key, ps, c.lastSeq, c.clock.Now(), true)
	c.mu.Unlock()
	return copies(es)
}

// ListStart marks when a list made outside the poller began.
type ListStart struct {
	seq uint64
	at  time.Time
}

// StartList is called before listing a backend outside the poller; the
// result goes to ReplaceListed.
func (c *Cache) StartList() ListStart {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ListStart{seq: c.lastSeq, at: c.clock.Now()}
}

// ReplaceListed is Replace for a list that began at start: objects written
// or deleted while it ran (by a poll or a request) keep their newer state,
// so concurrent lists never move an object back in time.
func (c *Cache) ReplaceListed(key string, start ListStart, objs []Object) []Object {
	return copies(c.replaceListed(key, start, objs))
}

// ReplaceListedShared is ReplaceListed returning the stored objects
// themselves (see Listed) instead of copies.
func (c *Cache) ReplaceListedShared(key string, start ListStart, objs []Object) []Listed {
	return listed(c.replaceListed(key, start, objs))
}

func (c *Cache) replaceListed(key string, start ListStart, objs []Object) []*entry {
	ps := c.prepare(key, objs)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.replaceLocked(key, ps, start.seq, start.at, true)
}

// replaceLocked implements Replace. Objects written or deleted after
// listedAfter (a seq taken before the List started) are newer than the list
// and keep their state; the next poll reconciles them.
func (c *Cache) replaceLocked(key string, ps []prepared, listedAfter uint64, at time.Time, wantEntries bool) []*entry {
	b := c.backendLocked(key)
	var batch []*event
	var out []*entry
	if wantEntries {
		out = make([]*entry, 0, len(ps))
	}
	present := make(map[string]bool, len(ps))
	for _, p := range ps {
		name := p.obj.GetName()
		if e := b.objs[name]; e != nil && e.seq > listedAfter {
			// Written after the list started, or a duplicate name in
			// this list: the stored object wins.
			present[name] = true
			if wantEntries {
				out = append(out, e)
			}
			continue
		}
		if s, ok := b.deleted[name]; ok && s > listedAfter {
			continue
		}
		e, ok, next := c.recordLocked(key, b, p, batch)
		batch = next
		if !ok {
			continue
		}
		present[name] = true
		if wantEntries {
			out = append(out, e)
		}
	}
	for _, name := range sortedNames(b) {
		if !present[name] && b.objs[name].seq <= listedAfter {
			batch = c.removeLocked(key, b, name, batch)
		}
	}
	for name, s := range b.deleted {
		if s <= listedAfter {
			delete(b.deleted, name)
		}
	}
	b.synced = true
	b.lastReplaced = at
	c.commitLocked(batch)
	return out
}

// mergeLocked applies a partial list: the objects it read are updated as
// replaceLocked would, the others are kept (no DELETED events), and the
// backend's sync state and LastReplaced stay as they were. It returns the
// entries holding the listed objects' names, as replaceLocked does.
func (c *Cache) mergeLocked(key string, ps []prepared, listedAfter uint64) []*entry {
	b := c.backendLocked(key)
	var batch []*event
	es := make([]*entry, 0, len(ps))
	for _, p := range ps {
		name := p.obj.GetName()
		if e := b.objs[name]; e != nil && e.seq > listedAfter {
			es = append(es, e)
			continue
		}
		if s, ok := b.deleted[name]; ok && s > listedAfter {
			continue
		}
		e, ok, next := c.recordLocked(key, b, p, batch)
		batch = next
		if ok {
			es = append(es, e)
		}
	}
	c.commitLocked(batch)
	return es
}

func sortedNames(b *backend) []string {
	names := make([]string, 0, len(b.objs))
	for n := range b.objs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Upsert records objects seen by a single read or written through this
// server; nothing is inferred about other objects. The cache stores copies
// of objs, as Replace does. It returns stamped deep copies in the order given, leaving out
// unusable objects (logged). It does not mark the backend synced.
func (c *Cache) Upsert(key string, objs ...Object) []Object {
	return copies(c.upsert(key, objs))
}

// UpsertListedShared is Upsert for what a read that began at start
// (StartList) returned, a caller's part of a backend or an incomplete
// list: objects written or deleted while it ran keep their newer state,
// as ReplaceListed keeps them, so that a read never moves an object back
// in time. It returns the stored objects as a list answers them, without
// copying them: the stored object in place of one written meanwhile, and
// none for one deleted meanwhile.
func (c *Cache) UpsertListedShared(key string, start ListStart, objs ...Object) []Listed {
	ps := c.prepare(key, objs)
	c.mu.Lock()
	defer c.mu.Unlock()
	return listed(c.mergeLocked(key, ps, start.seq))
}

func (c *Cache) upsert(key string, objs []Object) []*entry {
	ps := c.prepare(key, objs)
	c.mu.Lock()
	b := c.backendLocked(key)
	var batch []*event
	es := make([]*entry, 0, len(ps))
	for _, p := range ps {
		e, ok, next := c.recordLocked(key, b, p, batch)
		batch = next
		if ok {
			es = append(es, e)
		}
	}
	c.commitLocked(batch)
	c.mu.Unlock()
	return es
}

// UpsertIfUnchanged is Upsert of o, a change of the stored object of its
// name read at resourceVersion rv (with Get): when the stored object is
// no longer at rv (written since, or gone) it stores nothing and returns
// false, so that a read-modify-write never undoes a newer write; the
// caller reads again and retries.
func (c *Cache) UpsertIfUnchanged(key string, o Object, rv string) bool {
	ps := c.prepare(key, []Object{o})
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backends[key]
	if b == nil || len(ps) == 0 {
		return false
	}
	if e := b.objs[ps[0].obj.GetName()]; e == nil || e.obj.GetResourceVersion() != rv {
		return false
	}
	_, _, batch := c.recordLocked(key, b, ps[0], nil)
	c.commitLocked(batch)
	return true
}

// Delete records that the named objects of a backend are gone.
func (c *Cache) Delete(key string, names ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backends[key]
	if b == nil {
		return
	}
	var batch []*event
	for _, name := range names {
		batch = c.removeLocked(key, b, name, batch)
		if b.deleted == nil {
			b.deleted = map[string]uint64{}
		}
		b.deleted[name] = c.lastSeq
	}
	c.commitLocked(batch)
}

// Drop forgets a backend that no longer exists, emitting DELETED for each of
// its objects.
func (c *Cache) Drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(key)
}

func (c *Cache) dropLocked(key string) {
	b := c.backends[key]
	if b == nil {
		return
	}
	var batch []*event
	for _, name := range sortedNames(b) {
		batch = c.removeLocked(key, b, name, batch)
	}
	delete(c.backends, key)
	c.commitLocked(batch)
}
