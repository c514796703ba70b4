package storage

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// orgIDs remembers organization IDs by backend and name: they never
// change, and templates are looked up by organization ID.
type orgIDs struct {
	mu  sync.Mutex
	ids map[string]uuid.UUID
}

func (o *orgIDs) get(ctx context.Context, t target, org string) (uuid.UUID, error) {
	key := t.coderdKey() + "/" + org
	o.mu.Lock()
	id, ok := o.ids[key]
	o.mu.Unlock()
	if ok {
		return id, nil
	}
	got, err := t.Client.OrganizationByName(ctx, org)
	if err != nil {
		return uuid.Nil, fmt.Errorf("organization %q: %w", org, err)
	}
	o.mu.Lock()
	if o.ids == nil {
		o.ids = map[string]uuid.UUID{}
	}
	o.ids[key] = got.ID
	o.mu.Unlock()
	return got.ID, nil
}

// coderdID is an ID as one coderd (target.coderdKey) knows it.
type coderdID struct {
	coderd string
	id     uuid.UUID
}

// buildParams remembers each build's parameter values, per coderd. A
// build's parameters never change, so a steady-state poll asks coderd only
// about builds it has not seen.
type buildParams struct {
	mu    sync.Mutex
	byID  map[coderdID][]aggv1.WorkspaceParameter
	order []coderdID
	max   int
	// inflight shares one request per build between fills running at
	// once (a LIST and a poll of a cold cache would otherwise each ask
	// for every build).
	inflight singleflight.Group
}

func newBuildParams(max int) *buildParams {
	return &buildParams{byID: map[coderdID][]aggv1.WorkspaceParameter{}, max: max}
}

func (p *buildParams) lookup(id coderdID) ([]aggv1.WorkspaceParameter, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.byID[id]
	return v, ok
}

func (p *buildParams) store(id coderdID, v []aggv1.WorkspaceParameter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.byID[id]; ok {
		return
	}
	p.byID[id] = v
	p.order = append(p.order, id)
	for len(p.order) > p.max {
		delete(p.byID, p.order[0])
		p.order = p.order[1:]
	}
}

// fill returns the parameters of every build in ids of t's coderd, asking
// it (coderapi.MaxParallel at a time) for those not remembered. A build
// another fill is already asking about is waited for, not asked again.
func (p *buildParams) fill(ctx context.Context, t target, ids []uuid.UUID) (map[uuid.UUID][]aggv1.WorkspaceParameter, error) {
	out := make(map[uuid.UUID][]aggv1.WorkspaceParameter, len(ids))
	coderd := t.coderdKey()
	var missing []uuid.UUID
	for _, id := range ids {
		if id == uuid.Nil {
			continue
		}
		if v, ok := p.lookup(coderdID{coderd, id}); ok {
			out[id] = v
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for _, id := range missing {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			v, err := p.fetch(gctx, t, coderdID{coderd, id})
			if err != nil {
				return err
			}
			mu.Lock()
			out[id] = v
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// fetch asks coderd for one build's parameters and remembers them, or
// joins the request another fill has open for it. The request is not
// cancelled with ctx, since others may be waiting for it; the client's
// timeout bounds it.
func (p *buildParams) fetch(ctx context.Context, t target, id coderdID) ([]aggv1.WorkspaceParameter, error) {
	ch := p.inflight.DoChan(id.coderd+"/"+id.id.String(), func() (any, error) {
		if v, ok := p.lookup(id); ok {
			return v, nil
		}
		got, err := t.Client.WorkspaceBuildParameters(context.WithoutCancel(ctx), id.id)
		if err != nil {
			return nil, fmt.Errorf("parameters of build %s: %w", id.id, err)
		}
		v := toParameters(got)
		p.store(id, v)
		return v, nil
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.([]aggv1.WorkspaceParameter), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func toParameters(in []codersdk.WorkspaceBuildParameter) []aggv1.WorkspaceParameter {
	if len(in) == 0 {
		return nil
	}
	out := make([]aggv1.WorkspaceParameter, len(in))
	for i, p := range in {
		out[i] = aggv1.WorkspaceParameter{Name: p.Name, Value: p.Value}
	}
	return out
}

// listMemo remembers, per backend, what the last list of its coderd built
// from each workspace's JSON, by a hash of that JSON. It keeps one memo
// per backend: a memo of another coderd URL (or naming) is dropped when
// the backend's next list is kept, and the memo of a backend that is gone
// when the sources are listed (see retain), since each memo holds every
// workspace of its coderd.
type listMemo struct {
	mu   sync.Mutex
	byBE map[string]backendMemo
}

// backendMemo is one backend's memo, for the coderd and naming tag says.
type backendMemo struct {
	tag     string
	entries map[uint64]*memoEntry
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
func (m *listMemo) get(t target) map[uint64]*memoEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if bm, ok := m.byBE[t.Key()]; ok && bm.tag == memoTag(t) {
		return bm.entries
	}
	return nil
}

// set keeps entries as t's memo, replacing whatever the backend had.
func (m *listMemo) set(t target, entries map[uint64]*memoEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byBE == nil {
		m.byBE = map[string]backendMemo{}
	}
	m.byBE[t.Key()] = backendMemo{tag: memoTag(t), entries: entries}
}

// retain drops the memos of backends other than ts.
func (m *listMemo) retain(ts []target) {
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
