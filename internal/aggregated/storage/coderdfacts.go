package storage

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// coderdFacts remembers what coderd answered that never changes (an
// organization's ID, a template version whose build ended, a build's
// parameters), so that only new facts cost a request. IDs are only
// unique within one coderd, and a tenant's coderd may answer with any ID
// it likes, so a fact is kept per coderd (target.coderdKey) and never
// served for another. At most max facts are kept (0: no bound), the
// oldest dropped first. With a ttl, a fact is served that long and then
// asked again: for what coderd may change (its license).
type coderdFacts[K comparable, V any] struct {
	mu    sync.Mutex
	facts map[factKey[K]]fact[V]
	order []factKey[K]
	max   int
	ttl   time.Duration
}

// fact is a remembered answer and when it was given.
type fact[V any] struct {
	v  V
	at time.Time
}

func (f *coderdFacts[K, V]) fresh(x fact[V]) bool {
	return f.ttl <= 0 || time.Since(x.at) < f.ttl
}

// factKey is a fact's key as one coderd knows it.
type factKey[K comparable] struct {
	coderd string
	id     K
}

func (f *coderdFacts[K, V]) known(coderd string, id K) (V, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.facts[factKey[K]{coderd, id}]
	if !ok || !f.fresh(x) {
		var zero V
		return zero, false
	}
	return x.v, true
}

// add remembers v; a fact already known (and not expired) is kept as it
// is, age included.
func (f *coderdFacts[K, V]) add(coderd string, id K, v V) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := factKey[K]{coderd, id}
	old, known := f.facts[k]
	if known && f.fresh(old) {
		return
	}
	if f.facts == nil {
		f.facts = map[factKey[K]]fact[V]{}
	}
	f.facts[k] = fact[V]{v: v, at: time.Now()}
	if known || f.max <= 0 {
		return
	}
	f.order = append(f.order, k)
	for len(f.order) > f.max {
		delete(f.facts, f.order[0])
		f.order = f.order[1:]
	}
}

// put remembers v in place of what is known: a fresh answer (a get, a
// write) replaces the one the poller would otherwise serve.
func (f *coderdFacts[K, V]) put(coderd string, id K, v V) {
	f.mu.Lock()
	k := factKey[K]{coderd, id}
	if x, known := f.facts[k]; known {
		x.v, x.at = v, time.Now()
		f.facts[k] = x
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	f.add(coderd, id, v)
}

// get returns fact id of t's coderd, asking ask when it is not known; ask
// says whether its answer is final (remembered) or may still change.
func (f *coderdFacts[K, V]) get(ctx context.Context, t target, id K, ask func(context.Context) (V, bool, error)) (V, error) {
	coderd := t.coderdKey()
	if v, ok := f.known(coderd, id); ok {
		return v, nil
	}
	v, final, err := ask(ctx)
	if err == nil && final {
		f.add(coderd, id, v)
	}
	return v, err
}

// orgIDs remembers organization IDs by name: templates are looked up by
// organization ID.
type orgIDs struct {
	coderdFacts[string, uuid.UUID]
}

func (o *orgIDs) get(ctx context.Context, t target, org string) (uuid.UUID, error) {
	return o.coderdFacts.get(ctx, t, org, func(ctx context.Context) (uuid.UUID, bool, error) {
		got, err := t.Client.OrganizationByName(ctx, org)
		if err != nil {
			return uuid.Nil, false, fmt.Errorf("organization %q: %w", org, err)
		}
		return got.ID, true, nil
	})
}

// coderdFeatures is what a coderd's license lets it do.
type coderdFeatures struct {
	// openSource: the open-source build, which has no features.
	openSource bool
	enabled    map[codersdk.FeatureName]bool
}

// lacking says why a feature is missing.
func (f coderdFeatures) lacking() string {
	if f.openSource {
		return "open-source build"
	}
	return "not entitled by its license"
}

// refusal is the 422 field error of a change at p that needs feature,
// which this coderd lacks: one message for every kind and setting.
func (f coderdFeatures) refusal(p *field.Path, feature codersdk.FeatureName) *field.Error {
	return field.Forbidden(p, fmt.Sprintf("needs Coder's %q feature, which this coderd does not have (%s)", feature, f.lacking()))
}

// requireFeature refuses (422, naming the feature) a write of the object
// called name that needs feature when t's coderd lacks it; p is what the
// write changes. coderd's features are asked (and remembered for
// featureTTL), so that nothing in Coder is asked to change.
func (r *genericStore) requireFeature(ctx context.Context, fc *featureCache, t target, feature codersdk.FeatureName, name string, p *field.Path) error {
	f, err := fc.get(ctx, t)
	if err != nil {
		return r.coderErr(t, err, name)
	}
	if !f.enabled[feature] {
		return r.invalid(name, field.ErrorList{f.refusal(p, feature)})
	}
	return nil
}

// unlicensedErr is the same 422 for coderd's own answer to a write
// (404 "Route not found.", 405 with no body, 403 "... is a Premium
// feature"): the license changed since its features were asked.
func (r *genericStore) unlicensedErr(t target, err error, feature codersdk.FeatureName, name string, p *field.Path) error {
	reason, ok := coderapi.FeatureUnavailable(err)
	if !ok {
		return nil
	}
	f := coderdFeatures{openSource: reason == coderv1alpha1.ReasonNotSupported}
	return r.invalid(name, field.ErrorList{f.refusal(p, feature)})
}

// featureCache remembers each coderd's features for featureTTL: a license
// can be added or expire at any time, and a write that needs a feature
// should not cost a request each.
type featureCache struct {
	coderdFacts[struct{}, coderdFeatures]
}

const featureTTL = time.Minute

func newFeatureCache() featureCache {
	return featureCache{coderdFacts[struct{}, coderdFeatures]{ttl: featureTTL}}
}

// get asks coderd's entitlements: 404 "Route not found." is the
// open-source build, otherwise each feature's Enabled (what enterprise
// coderd switches its behaviour on).
func (c *featureCache) get(ctx context.Context, t target) (coderdFeatures, error) {
	return c.coderdFacts.get(ctx, t, struct{}{}, func(ctx context.Context) (coderdFeatures, bool, error) {
		e, err := t.Client.Entitlements(ctx)
		if err != nil {
			if reason, ok := coderapi.FeatureUnavailable(err); ok && reason == coderv1alpha1.ReasonNotSupported {
				return coderdFeatures{openSource: true}, true, nil
			}
			return coderdFeatures{}, false, fmt.Errorf("entitlements: %w", err)
		}
		f := coderdFeatures{enabled: map[codersdk.FeatureName]bool{}}
		for name, feat := range e.Features {
			if feat.Enabled {
				f.enabled[name] = true
			}
		}
		return f, true, nil
	})
}

// versionCache remembers template versions whose build has ended: their
// source and job no longer change. Their name and message still may (a
// PATCH from the Coder UI, or from another replica of coder-k8s), so a
// version is asked again after versionTTL; a change this server makes
// replaces it at once (put).
type versionCache struct {
	coderdFacts[uuid.UUID, codersdk.TemplateVersion]
}

const versionTTL = time.Minute

func newVersionCache() versionCache {
	return versionCache{coderdFacts[uuid.UUID, codersdk.TemplateVersion]{max: 10000, ttl: versionTTL}}
}

func (c *versionCache) get(ctx context.Context, t target, id uuid.UUID) (codersdk.TemplateVersion, error) {
	return c.coderdFacts.get(ctx, t, id, func(ctx context.Context) (codersdk.TemplateVersion, bool, error) {
		v, err := t.Client.TemplateVersion(ctx, id)
		return v, err == nil && !buildInProgress(v.Job.Status), err
	})
}

// buildParams remembers each build's parameter values. A build's
// parameters never change, so a steady-state poll asks coderd only about
// builds it has not seen.
type buildParams struct {
	coderdFacts[uuid.UUID, []aggv1.WorkspaceParameter]
	// inflight shares one request per build between fills running at
	// once (a LIST and a poll of a cold cache would otherwise each ask
	// for every build).
	inflight singleflight.Group
}

func newBuildParams(max int) *buildParams {
	return &buildParams{coderdFacts: coderdFacts[uuid.UUID, []aggv1.WorkspaceParameter]{max: max}}
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
		if v, ok := p.known(coderd, id); ok {
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
			v, err := p.fetch(gctx, t, coderd, id)
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
func (p *buildParams) fetch(ctx context.Context, t target, coderd string, id uuid.UUID) ([]aggv1.WorkspaceParameter, error) {
	ch := p.inflight.DoChan(coderd+"/"+id.String(), func() (any, error) {
		if v, ok := p.known(coderd, id); ok {
			return v, nil
		}
		got, err := t.Client.WorkspaceBuildParameters(context.WithoutCancel(ctx), id)
		if err != nil {
			return nil, fmt.Errorf("parameters of build %s: %w", id, err)
		}
		v := toParameters(got)
		p.add(coderd, id, v)
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
