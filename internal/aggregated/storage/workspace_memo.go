package storage

import (
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
)

// listMemo remembers, per backend, what the last list of its coderd made
// of each item's JSON (E: a workspace's memoEntry, a decoded template
// version), by a hash of that JSON. It keeps one memo per backend: a memo
// of another coderd URL (or naming) is dropped when the backend's next
// list is kept, and the memo of a backend that is gone when the sources
// are listed (see retain), since each memo holds every item of its
// coderd. A memo that is kept is never changed: lists running at once
// read it while the next is built.
type listMemo[E any] struct {
	mu   sync.Mutex
	byBE map[string]backendMemo[E]
}

// backendMemo is one backend's memo, for the coderd and naming tag says.
type backendMemo[E any] struct {
	tag     string
	entries map[uint64]E
}

// memoEntry is what a list built from one workspace's JSON. Lists running
// at once share it: a list that merges another record makes a new entry,
// and only obj changes in place, to the watch cache's object of the same
// content.
type memoEntry struct {
	// obj is Coder's view, merged with the record at recordRV ("" for
	// none) once merged is set. mergeRecord replaces all it merged, so a
	// merged view is merged with another record as Coder's view would be.
	// Once the watch cache holds this content, obj is the cache's
	// (immutable) object, so that 10,000 workspaces are held once, not
	// twice (see cached).
	obj      atomic.Pointer[aggv1.CoderWorkspace]
	merged   bool
	recordRV string
	// fp is obj's watch cache fingerprint, and specHash the spec hash the
	// merge found to count ("" none); both set with merged.
	fp       uint64
	specHash string
}

func newMemoEntry(obj *aggv1.CoderWorkspace) *memoEntry {
	e := &memoEntry{}
	e.obj.Store(obj)
	return e
}

// cached hands the entry's object to the watch cache with its
// fingerprint, and takes the cache's object of the same content as the
// entry's from then on.
func (e *memoEntry) cached() watchcache.Object {
	return watchcache.WithFingerprint(e.obj.Load(), e.fp, func(stored watchcache.Object) {
		if ws, ok := stored.(*aggv1.CoderWorkspace); ok {
			e.obj.Store(ws)
		}
	})
}

// memoTag tells apart the memos a backend may have had: the coderd its
// client calls and whether names carry the control plane.
func memoTag(t target) string {
	return t.coderdKey() + "/" + strconv.FormatBool(t.prefixed)
}

// get returns t's memo, or nil when the last list kept was of another
// coderd or naming.
func (m *listMemo[E]) get(t target) map[uint64]E {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bm, ok := m.byBE[t.Key()]; ok && bm.tag == memoTag(t) {
		return bm.entries
	}
	return nil
}

// set keeps entries as t's memo, replacing whatever the backend had.
func (m *listMemo[E]) set(t target, entries map[uint64]E) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byBE == nil {
		m.byBE = map[string]backendMemo[E]{}
	}
	m.byBE[t.Key()] = backendMemo[E]{tag: memoTag(t), entries: entries}
}

// retain drops the memos of backends other than ts.
func (m *listMemo[E]) retain(ts []target) {
	keep := make(map[string]bool, len(ts))
	for _, t := range ts {
		keep[t.Key()] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for key := range m.byBE {
		if !keep[key] {
			delete(m.byBE, key)
		}
	}
}

// memoSeed seeds the list memo's hashes; the memo lives only in this
// process.
var memoSeed = maphash.MakeSeed()

// hashBytes is a 64-bit hash of b: maphash, which reads a large list's
// JSON many times faster than FNV does.
func hashBytes(b []byte) uint64 {
	return maphash.Bytes(memoSeed, b)
}
