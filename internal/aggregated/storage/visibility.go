package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/identity"
)

// What a caller is shown: the objects coderd lets them read, without the
// restricted fields of those they may not update, for a GET, a LIST and a
// WATCH (watchfilter.go) alike.

// refusedReads turns a caller's refusal into what a read answers: a plain
// 404, as for an object that does not exist.
func (r *genericStore) refusedReads(name string, err error) error {
	var refused *callerRefused
	if errors.As(err, &refused) {
		return r.hidden(name)
	}
	return err
}

// hidden is the 404 of an object the caller may not read: the same as for
// an object that does not exist (coderd answers so too).
func (r *genericStore) hidden(name string) error {
	return apierrors.NewNotFound(r.gr, name)
}

// callers is who reads, per backend key: the caller of each backend that
// maps identities (a cluster controller's caller included). Backends
// without an entry are read as the operator.
type callers map[string]*identity.Caller

// callersOf maps the caller in each of ts and returns the backends the
// request reads. A backend where the caller may not act is left out with
// a warning naming why, so that a list or watch by someone with no Coder
// user answers with nothing rather than failing. Across namespaces a
// backend whose coderd cannot say who the caller is (down, hanging) is
// left out with a warning too; a request naming one namespace fails then.
func (r *genericStore) callersOf(ctx context.Context, ts []target, allNamespaces bool, warn *warnings) (callers, []target, error) {
	mapped := make([]target, len(ts))
	errs := make([]error, len(ts))
	g := errgroup.Group{}
	g.SetLimit(8)
	for i, t := range ts {
		g.Go(func() error {
			cctx := ctx
			if allNamespaces {
				// Only what the identity service remembers: a coderd
				// known to be down would hold up every backend.
				cctx = r.quick(ctx, t.Key())
			}
			mapped[i], errs[i] = r.caller(cctx, t, "")
			return nil
		})
	}
	_ = g.Wait()
	cs := callers{}
	out := ts[:0:0]
	for i, t := range mapped {
		var refused *callerRefused
		switch {
		case errors.As(errs[i], &refused):
			warn.add(refused.reason, fmt.Sprintf("no %s of %s are shown", r.gr.Resource, t.describe()))
			continue
		case errs[i] != nil && allNamespaces:
			warn.add(r.cannotAsk(t, errs[i], "who you are"), fmt.Sprintf("your %s there are not shown", r.gr.Resource))
			continue
		case errs[i] != nil:
			return nil, nil, errs[i]
		}
		switch {
		case t.caller != nil:
			cs[t.Key()] = t.caller
		case t.controller != nil:
			cs[t.Key()] = t.controller
		}
		out = append(out, t)
	}
	return cs, out, nil
}

// quick returns ctx, or, when the coderd of backend key is known to be
// failing, a context that has already ended, so that only what is
// remembered answers and nothing waits for that coderd.
func (r *genericStore) quick(ctx context.Context, key string) context.Context {
	if _, down := r.cache.Outage(key); !down {
		return ctx
	}
	c, cancel := context.WithCancel(ctx)
	cancel()
	return c
}

// cannotAsk says why coderd of t could not answer a question about the
// caller: the outage it is known for, or the error.
func (r *genericStore) cannotAsk(t target, err error, what string) string {
	if out, down := r.cache.Outage(t.Key()); down {
		return outageReason(t, out)
	}
	return fmt.Sprintf("coder-k8s cannot ask %s %s: %v", t.describe(), what, errMessage(err))
}

// shown is what a viewer sees of objects: whether they may read each, and
// whether they see its restricted fields. failed holds, by backend key,
// the backends whose coderd could not answer; their objects are unread.
type shown struct {
	read, full []bool
	failed     map[string]error
}

// shownTo answers, for each object, what its backend's caller sees of
// it; objects of backends without a caller are shown whole. Across
// namespaces, backends quick says are down are answered from what the
// identity service remembers only; a read of one namespace or object
// asks coderd, as callersOf does, so that a poll that failed once does
// not fail it unasked.
func (r *genericStore) shownTo(ctx context.Context, cs callers, objs []watchcache.Object, allNamespaces bool) shown {
	d := shown{read: make([]bool, len(objs)), full: make([]bool, len(objs))}
	type pending struct {
		key   string
		idx   []int
		items []objectChecks
	}
	per := map[*identity.Caller]*pending{}
	for i, o := range objs {
		key := backendKey(o)
		c := cs[key]
		switch {
		case c == nil:
			d.read[i], d.full[i] = true, true
			continue
		case c.ClusterController:
			// Every object, without the fields only those who may change
			// them see: the cluster's controllers need metadata alone.
			d.read[i] = true
			continue
		}
		oc, ok := r.access.checks(o)
		if !ok {
			continue
		}
		p := per[c]
		if p == nil {
			p = &pending{key: key}
			per[c] = p
		}
		p.idx = append(p.idx, i)
		p.items = append(p.items, oc)
	}
	var mu sync.Mutex
	var g errgroup.Group
	for c, p := range per {
		g.Go(func() error {
			cctx := ctx
			if allNamespaces {
				cctx = r.quick(ctx, p.key)
			}
			read, full, err := answer(cctx, c, p.items)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if d.failed == nil {
					d.failed = map[string]error{}
				}
				d.failed[p.key] = err
				return nil
			}
			for j, i := range p.idx {
				d.read[i], d.full[i] = read[j], full[j]
			}
			return nil
		})
	}
	_ = g.Wait()
	return d
}

// answer asks coderd, as c, what c sees of each object: first the checks
// that cover many objects (and the per-object ones of kinds that have no
// such), then the per-object read of objects the broad ones did not
// allow. Batches as coderd allows are the identity service's.
func answer(ctx context.Context, c *identity.Caller, items []objectChecks) (read, full []bool, err error) {
	var first []identity.Check
	for _, it := range items {
		if it.readAll != nil {
			first = append(first, *it.readAll)
		} else {
			first = append(first, it.read)
		}
		if it.updateAll != nil {
			first = append(first, *it.updateAll)
		} else {
			first = append(first, it.update)
		}
	}
	got, err := c.Allowed(ctx, first)
	if err != nil {
		return nil, nil, err
	}
	read, full = make([]bool, len(items)), make([]bool, len(items))
	var second []identity.Check
	var secondIdx []int
	for j, it := range items {
		read[j], full[j] = got[2*j], got[2*j+1]
		if it.readAll != nil && !read[j] {
			second = append(second, it.read)
			secondIdx = append(secondIdx, j)
		}
	}
	if len(second) > 0 {
		got, err := c.Allowed(ctx, second)
		if err != nil {
			return nil, nil, err
		}
		for k, j := range secondIdx {
			read[j] = got[k]
		}
	}
	for j := range items {
		// Restricted fields only with the object itself.
		full[j] = full[j] && read[j]
	}
	return read, full, nil
}

// filterListed keeps what the viewer may read, without the fields of
// objects whose restricted fields they may not see. Across namespaces a
// backend whose coderd cannot answer is left out with a warning; a
// request naming one namespace fails with 503.
func (r *genericStore) filterListed(ctx context.Context, cs callers, listed []watchcache.Listed, allNamespaces bool, warn *warnings) ([]watchcache.Listed, error) {
	if len(cs) == 0 {
		return listed, nil
	}
	objs := make([]watchcache.Object, len(listed))
	for i, l := range listed {
		objs[i] = l.Obj
	}
	d := r.shownTo(ctx, cs, objs, allNamespaces)
	for key, err := range d.failed {
		if !allNamespaces {
			return nil, apierrors.NewServiceUnavailable("ask coderd what the caller may read: " + err.Error())
		}
		warn.add(r.cannotAsk(target{Backend: backendOf(key)}, err, "what you may read"), fmt.Sprintf("your %s there are not shown", r.gr.Resource))
	}
	out := make([]watchcache.Listed, 0, len(listed))
	for i, l := range listed {
		switch {
		case !d.read[i]:
		case d.full[i]:
			out = append(out, l)
		default:
			out = append(out, watchcache.Derived(r.access.redact(l.Obj)))
		}
	}
	return out, nil
}

// filterOne is filterListed for one object a caller reads: a plain 404
// when they may not read it, as coderd answers.
func (r *genericStore) filterOne(ctx context.Context, t target, obj watchcache.Object) (watchcache.Object, error) {
	c := t.caller
	if c == nil {
		c = t.controller
	}
	if c == nil {
		return obj, nil
	}
	d := r.shownTo(ctx, callers{t.Key(): c}, []watchcache.Object{obj}, false)
	for _, err := range d.failed {
		return nil, r.coderErr(t, err, obj.GetName())
	}
	switch {
	case !d.read[0]:
		return nil, r.hidden(obj.GetName())
	case !d.full[0]:
		return r.access.redact(obj), nil
	}
	return obj, nil
}
