package watchcache

// What the cache answers: copies of its objects, or the stored objects
// themselves as lists answer them (Listed), and the backends' sync state.

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// Listed is a stored object as a list answers it without copying it:
// Obj is the cache's own, which nobody modifies; callers must not either
// (a shallow copy of the struct shares its maps and slices).
type Listed struct {
	Obj Object
	e   *entry
}

// JSON returns json.Marshal(Obj), encoded once for each stored version
// of the object and kept with it, so that lists serve an unchanged
// object's encoding again.
func (l Listed) JSON() ([]byte, error) {
	if l.e != nil {
		if b := l.e.json.Load(); b != nil {
			return *b, nil
		}
	}
	data, err := json.Marshal(l.Obj)
	if err != nil {
		return nil, fmt.Errorf("encoding %q: %w", l.Obj.GetName(), err)
	}
	if l.e != nil {
		l.e.json.Store(&data)
	}
	return data, nil
}

// Derived lists obj, made from a stored object for one caller (fields
// they may not see removed), in its place: it is encoded on its own,
// never with the stored object's encoding.
func Derived(obj Object) Listed { return Listed{Obj: obj} }

func copies(es []*entry) []Object {
	if es == nil {
		return nil
	}
	out := make([]Object, len(es))
	for i, e := range es {
		out[i] = deepCopy(e.obj)
	}
	return out
}

func listed(es []*entry) []Listed {
	if es == nil {
		return nil
	}
	out := make([]Listed, len(es))
	for i, e := range es {
		out[i] = Listed{Obj: e.obj, e: e}
	}
	return out
}

// Get returns a deep copy of one object.
func (c *Cache) Get(key, name string) (Object, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backends[key]
	if b == nil {
		return nil, false
	}
	e := b.objs[name]
	if e == nil {
		return nil, false
	}
	return deepCopy(e.obj), true
}

// Snapshot returns deep copies of every object of the backends match accepts
// (nil accepts all), sorted by namespace then name, and the list
// resourceVersion they are consistent with.
func (c *Cache) Snapshot(match func(key string) bool) ([]Object, string) {
	c.mu.Lock()
	stored := c.entriesLocked(match)
	rv := c.listRV(c.lastSeq)
	c.mu.Unlock()
	return copies(stored), rv
}

// SnapshotShared is Snapshot returning the stored objects themselves (see
// Listed) instead of copies.
func (c *Cache) SnapshotShared(match func(key string) bool) ([]Listed, string) {
	c.mu.Lock()
	stored := c.entriesLocked(match)
	rv := c.listRV(c.lastSeq)
	c.mu.Unlock()
	out := listed(stored)
	if out == nil {
		out = []Listed{}
	}
	return out, rv
}

// Select returns the stored (shared: read only) objects of backend key
// that keep accepts, in no order. keep runs under the cache's lock: it
// must be quick and must not call the cache. Unlike Snapshot nothing is
// copied or sorted, so it suits a frequent look for a few objects.
func (c *Cache) Select(key string, keep func(Object) bool) []Object {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backends[key]
	if b == nil {
		return nil
	}
	var out []Object
	for _, e := range b.objs {
		if keep(e.obj) {
			out = append(out, e.obj)
		}
	}
	return out
}

// objectsLocked returns the stored (immutable) objects of matching backends,
// sorted by namespace then name.
func (c *Cache) objectsLocked(match func(key string) bool) []Object {
	es := c.entriesLocked(match)
	objs := make([]Object, len(es))
	for i, e := range es {
		objs[i] = e.obj
	}
	return objs
}

// entriesLocked returns the entries of matching backends, sorted by
// namespace then name.
func (c *Cache) entriesLocked(match func(key string) bool) []*entry {
	var es []*entry
	for key, b := range c.backends {
		if match != nil && !match(key) {
			continue
		}
		for _, e := range b.objs {
			es = append(es, e)
		}
	}
	sort.Slice(es, func(i, j int) bool {
		if ni, nj := es[i].obj.GetNamespace(), es[j].obj.GetNamespace(); ni != nj {
			return ni < nj
		}
		return es[i].obj.GetName() < es[j].obj.GetName()
	})
	return es
}

// Synced reports whether the backend has had a full Replace.
func (c *Cache) Synced(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backends[key]
	return b != nil && b.synced
}

// LastReplaced returns when the backend's state was last known complete: the
// time of the last Replace call, or for polls the time its List started.
// Zero if never.
func (c *Cache) LastReplaced(key string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.backends[key]; b != nil {
		return b.lastReplaced
	}
	return time.Time{}
}
