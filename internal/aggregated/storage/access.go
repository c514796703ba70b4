package storage

import (
	"context"
	"fmt"
	"sync"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/identity"
)

// access says, for one kind, what coderd must allow for a caller to see
// an object (read) and its restricted fields (update), and how the object
// looks without those fields.
type access struct {
	checks func(watchcache.Object) (read, update identity.Check, ok bool)
	// redact returns a copy of the object without the fields only those
	// who may update it see; the object itself is shared and unchanged.
	redact func(watchcache.Object) watchcache.Object
}

var workspaceAccess = access{
	checks: func(o watchcache.Object) (identity.Check, identity.Check, bool) {
		ws := o.(*aggv1.CoderWorkspace)
		org, err1 := uuid.Parse(ws.Status.OrganizationID)
		owner, err2 := uuid.Parse(ws.Status.OwnerID)
		if err1 != nil || err2 != nil {
			return identity.Check{}, identity.Check{}, false
		}
		// The set of the owner's workspaces in the organization: one
		// check serves all of them, and it is what Coder's roles decide.
		read := identity.Check{Resource: codersdk.ResourceWorkspace, Action: codersdk.ActionRead, OrganizationID: org, OwnerID: owner}
		update := read
		update.Action = codersdk.ActionUpdate
		return read, update, true
	},
	redact: func(o watchcache.Object) watchcache.Object {
		ws := o.(*aggv1.CoderWorkspace)
		if ws.Spec.Parameters == nil {
			return ws
		}
		c := *ws
		c.Spec.Parameters = nil
		return &c
	},
}

var templateAccess = access{
	checks: func(o watchcache.Object) (identity.Check, identity.Check, bool) {
		tpl := o.(*aggv1.CoderTemplate)
		id, err := uuid.Parse(tpl.Status.ID)
		if err != nil {
			return identity.Check{}, identity.Check{}, false
		}
		// By ID, so that coderd applies the template's user and group
		// ACLs.
		read := identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionRead, ResourceID: id}
		update := read
		update.Action = codersdk.ActionUpdate
		return read, update, true
	},
	redact: func(o watchcache.Object) watchcache.Object {
		tpl := o.(*aggv1.CoderTemplate)
		if tpl.Spec.Files == nil {
			return tpl
		}
		c := *tpl
		c.Spec.Files = nil
		return &c
	},
}

// caller maps the request's Kubernetes user onto its Coder user in t's
// coderd when t maps identities; t.caller stays nil (the operator acts)
// in Operator mode. A caller who cannot be mapped gets 403 naming why.
func (r *resource) caller(ctx context.Context, t target, name string) (target, error) {
	if r.ident == nil || !t.Identity.Mapped() {
		return t, nil
	}
	u, _ := genericapirequest.UserFrom(ctx)
	c, err := r.ident.Caller(ctx, t.coderd(), u)
	if identity.IsRefused(err) {
		return t, apierrors.NewForbidden(r.gr, name, err)
	}
	if err != nil {
		return t, r.coderErr(t, err, name)
	}
	t.caller = c
	return t, nil
}

// coderd describes t's coderd to the identity service.
func (t target) coderd() identity.Coderd {
	name, tag := "the static backend", "static"
	if t.ControlPlane != "" {
		name, tag = fmt.Sprintf("control plane %s/%s", t.Namespace, t.ControlPlane), t.Namespace+"_"+t.ControlPlane
	}
	return identity.Coderd{Key: t.coderdKey(), Name: name, Tag: tag, Owner: t.Client, Rules: t.Identity}
}

// acting returns t calling coderd as its caller: what writes use, so that
// coderd decides and its audit log names the caller.
func (t target) acting() target {
	if t.caller != nil && t.operator == nil {
		t.operator, t.Client = t.Client, t.caller.Client
	}
	return t
}

// operatorClient calls t's coderd as the operator, whoever acts: for what
// only the operator reads (another user's ID to ask coderd about).
func (t target) operatorClient() *codersdk.Client {
	if t.operator != nil {
		return t.operator
	}
	return t.Client
}

// viewer is who reads, per backend: the callers of the backends that map
// identities, by target key. Backends without one are read as the
// operator.
type viewer map[string]*identity.Caller

// viewerOf maps the caller in each of ts. A request naming one namespace
// is refused when the caller cannot be mapped in one of its backends; a
// request across namespaces leaves out the backends where the caller has
// no Coder user, and is refused only when that is all of them.
func (r *resource) viewerOf(ctx context.Context, ts []target, allNamespaces bool) (viewer, []target, error) {
	v := viewer{}
	out := ts[:0:0]
	var refused error
	for _, t := range ts {
		mt, err := r.caller(ctx, t, "")
		if apierrors.IsForbidden(err) && allNamespaces {
			refused = err
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if mt.caller != nil {
			v[t.Key()] = mt.caller
		}
		out = append(out, mt)
	}
	if len(out) == 0 && refused != nil {
		return nil, nil, refused
	}
	return v, out, nil
}

// backendKey is the target key of an object: its namespace and the control
// plane its label names ("" for the static backend).
func backendKey(o watchcache.Object) string {
	return o.GetNamespace() + "/" + o.GetLabels()[aggv1.LabelControlPlane]
}

// decisions answers, for each object, whether its caller may read it and
// update it; objects of backends without a caller are readable and
// updatable.
func (r *resource) decisions(ctx context.Context, v viewer, objs []watchcache.Object) (read, update []bool, err error) {
	read, update = make([]bool, len(objs)), make([]bool, len(objs))
	type pending struct {
		idx    []int
		checks []identity.Check
	}
	per := map[*identity.Caller]*pending{}
	for i, o := range objs {
		c := v[backendKey(o)]
		if c == nil {
			read[i], update[i] = true, true
			continue
		}
		rc, uc, ok := r.access.checks(o)
		if !ok {
			continue
		}
		p := per[c]
		if p == nil {
			p = &pending{}
			per[c] = p
		}
		p.idx = append(p.idx, i)
		p.checks = append(p.checks, rc, uc)
	}
	for c, p := range per {
		got, err := c.Allowed(ctx, p.checks)
		if err != nil {
			return nil, nil, err
		}
		for j, i := range p.idx {
			read[i], update[i] = got[2*j], got[2*j+1]
		}
	}
	return read, update, nil
}

// filterListed keeps what the viewer may read, without the fields of
// objects they may not update.
func (r *resource) filterListed(ctx context.Context, v viewer, listed []watchcache.Listed) ([]watchcache.Listed, error) {
	if len(v) == 0 {
		return listed, nil
	}
	objs := make([]watchcache.Object, len(listed))
	for i, l := range listed {
		objs[i] = l.Obj
	}
	read, update, err := r.decisions(ctx, v, objs)
	if err != nil {
		return nil, apierrors.NewServiceUnavailable("ask coderd what the caller may read: " + err.Error())
	}
	out := make([]watchcache.Listed, 0, len(listed))
	for i, l := range listed {
		switch {
		case !read[i]:
		case update[i]:
			out = append(out, l)
		default:
			out = append(out, watchcache.Derived(r.access.redact(l.Obj)))
		}
	}
	return out, nil
}

// filterOne is filterListed for one object a caller reads: NotFound when
// they may not read it, as coderd answers.
func (r *resource) filterOne(ctx context.Context, t target, obj watchcache.Object) (watchcache.Object, error) {
	if t.caller == nil {
		return obj, nil
	}
	read, update, err := r.decisions(ctx, viewer{t.Key(): t.caller}, []watchcache.Object{obj})
	if err != nil {
		return nil, r.coderErr(t, err, obj.GetName())
	}
	switch {
	case !read[0]:
		return nil, r.notFound(obj.GetName(), fmt.Sprintf("Coder user %q may not read it", t.caller.Username))
	case !update[0]:
		return r.access.redact(obj), nil
	}
	return obj, nil
}

// filterWatch passes on the events of objects the viewer may read,
// without the fields of objects they may not update. An object that
// becomes readable arrives as ADDED, one that stops being readable as
// DELETED.
func (r *resource) filterWatch(ctx context.Context, v viewer, in watch.Interface) watch.Interface {
	if len(v) == 0 {
		return in
	}
	fw := &filteredWatch{in: in, out: make(chan watch.Event), done: make(chan struct{})}
	go fw.run(ctx, r, v)
	return fw
}

type filteredWatch struct {
	in   watch.Interface
	out  chan watch.Event
	done chan struct{}
	stop sync.Once
}

func (w *filteredWatch) Stop() {
	w.stop.Do(func() {
		close(w.done)
		w.in.Stop()
	})
}

func (w *filteredWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *filteredWatch) run(ctx context.Context, r *resource, v viewer) {
	defer close(w.out)
	defer w.in.Stop()
	sent := map[string]bool{}
	send := func(ev watch.Event) bool {
		select {
		case w.out <- ev:
			return true
		case <-w.done:
		case <-ctx.Done():
		}
		return false
	}
	for {
		var ev watch.Event
		var ok bool
		select {
		case ev, ok = <-w.in.ResultChan():
		case <-w.done:
			return
		case <-ctx.Done():
			return
		}
		if !ok {
			return
		}
		obj, isObj := ev.Object.(watchcache.Object)
		if !isObj || ev.Type == watch.Bookmark || ev.Type == watch.Error {
			if !send(ev) {
				return
			}
			continue
		}
		key := string(obj.GetUID())
		read, update, err := r.decisions(ctx, v, []watchcache.Object{obj})
		if err != nil {
			send(watch.Event{Type: watch.Error, Object: &apierrors.NewServiceUnavailable("ask coderd what the caller may read: " + err.Error()).ErrStatus})
			return
		}
		out := ev
		if ev.Type != watch.Deleted && !update[0] {
			out.Object = r.access.redact(obj)
		}
		switch {
		case ev.Type == watch.Deleted:
			if !sent[key] && !read[0] {
				continue
			}
			delete(sent, key)
		case read[0]:
			if !sent[key] {
				out.Type = watch.Added
			}
			sent[key] = true
		case sent[key]:
			delete(sent, key)
			out.Type = watch.Deleted
		default:
			continue
		}
		if !send(out) {
			return
		}
	}
}

// mayWrite refuses a write coderd would refuse the caller (asked before
// anything is written, so a dry run answers as the write would, and so
// that a change of Kubernetes metadata alone, which coderd never sees,
// needs what a change in Coder needs), and returns t acting as the caller.
func (r *resource) mayWrite(ctx context.Context, t target, cur watchcache.Object, action codersdk.RBACAction) (target, error) {
	if t.caller == nil {
		return t, nil
	}
	rc, uc, ok := r.access.checks(cur)
	if !ok {
		return t, apierrors.NewInternalError(fmt.Errorf("%s %s carries no Coder IDs to authorize", r.kind, cur.GetName()))
	}
	c := uc
	if action != codersdk.ActionUpdate {
		c = rc
		c.Action = action
	}
	if err := r.mayDo(ctx, t, c, cur.GetName()); err != nil {
		return t, err
	}
	return t.acting(), nil
}

// res is the resource shared paths filter with.
func (r *resource) res() *resource { return r }

// mayCreate asks coderd whether the caller may create c: what a dry-run
// create answers in place of coderd's own refusal.
func (r *resource) mayCreate(ctx context.Context, t target, c identity.Check, name string) error {
	if t.caller == nil {
		return nil
	}
	return r.mayDo(ctx, t, c, name)
}

// mayDo asks coderd, with the caller's token, whether they may do c to
// the object called name: 403 naming their Coder user when not.
func (r *resource) mayDo(ctx context.Context, t target, c identity.Check, name string) error {
	got, err := t.caller.Allowed(ctx, []identity.Check{c})
	if err != nil {
		return r.coderErr(t, err, name)
	}
	if !got[0] {
		return apierrors.NewForbidden(r.gr, name, &identity.Refused{Reason: fmt.Sprintf("Coder user %q may not %s it in %s", t.caller.Username, c.Action, t.coderd().Name)})
	}
	return nil
}
