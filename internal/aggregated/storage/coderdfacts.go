package storage

import (
	"context"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
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
