package storage

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/warning"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/identity"
)

// access says, for one kind, what coderd must allow for a caller to see
// an object and its restricted fields, and how the object looks without
// those fields.
type access struct {
	checks func(watchcache.Object) (objectChecks, bool)
	// redact returns a copy of the object without the fields only those
	// who may update it see; the object itself is shared and unchanged.
	redact func(watchcache.Object) watchcache.Object
}

// objectChecks are the questions to coderd that decide what a caller
// sees of one object.
type objectChecks struct {
	// read and update are asked of the object itself; writes ask update
	// (or read with the write's action).
	read, update identity.Check
	// readAll, when set, covers every object of the kind in the object's
	// organization: allowed, it answers read without asking per object.
	readAll *identity.Check
	// updateAll, when set, decides on reads whether the restricted fields
	// are shown, in place of update: asking update per object would
	// double what a list or a new watch costs in checks.
	updateAll *identity.Check
}

var workspaceAccess = access{
	checks: func(o watchcache.Object) (objectChecks, bool) {
		ws := o.(*aggv1.CoderWorkspace)
		org, err1 := uuid.Parse(ws.Status.OrganizationID)
		owner, err2 := uuid.Parse(ws.Status.OwnerID)
		if err1 != nil || err2 != nil {
			return objectChecks{}, false
		}
		// The set of the owner's workspaces in the organization: one
		// check serves all of them, and it is what Coder's roles decide.
		read := identity.Check{Resource: codersdk.ResourceWorkspace, Action: codersdk.ActionRead, OrganizationID: org, OwnerID: owner}
		update := read
		update.Action = codersdk.ActionUpdate
		return objectChecks{read: read, update: update}, true
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
	checks: func(o watchcache.Object) (objectChecks, bool) {
		tpl := o.(*aggv1.CoderTemplate)
		id, err1 := uuid.Parse(tpl.Status.ID)
		org, err2 := uuid.Parse(tpl.Status.OrganizationID)
		if err1 != nil || err2 != nil {
			return objectChecks{}, false
		}
		// By ID, so that coderd applies the template's user and group
		// ACLs; unless the caller may read every template of the
		// organization.
		read := identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionRead, ResourceID: id}
		update := read
		update.Action = codersdk.ActionUpdate
		readAll := identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionRead, OrganizationID: org}
		// The files are shown to those who may update every template of
		// the organization (template and organization admins, owners).
		updateAll := readAll
		updateAll.Action = codersdk.ActionUpdate
		return objectChecks{read: read, update: update, readAll: &readAll, updateAll: &updateAll}, true
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

// callerRefused is a caller who may not act in a backend at all (no Coder
// user, a suspended one, an unmapped system user): 403 for writes, while
// reads answer as if there were nothing (an empty list with a warning, a
// plain 404), so that cluster-wide readers keep working and nothing tells
// whether an object exists.
type callerRefused struct {
	*apierrors.StatusError
	reason string
}

// caller maps the request's Kubernetes user onto its Coder user in t's
// coderd when t maps identities; t.caller stays nil (the operator acts)
// in Operator mode, and for the cluster's own controllers (identity
// service's ClusterController), which act as the operator with the
// limits t.controller sets.
func (r *genericStore) caller(ctx context.Context, t target, name string) (target, error) {
	if r.ident == nil || !t.Identity.Mapped() {
		return t, nil
	}
	u, _ := genericapirequest.UserFrom(ctx)
	c, err := r.ident.Caller(ctx, t.coderd(), u)
	if identity.IsRefused(err) {
		return t, &callerRefused{StatusError: apierrors.NewForbidden(r.gr, name, err), reason: err.Error()}
	}
	if err != nil {
		return t, r.coderErr(t, err, name)
	}
	if c.ClusterController {
		t.controller = c
		return t, nil
	}
	t.caller = c
	return t, nil
}

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

// coderd describes t's coderd to the identity service.
func (t target) coderd() identity.Coderd {
	return identity.Coderd{Key: t.coderdKey(), Name: t.describe(), Tag: t.tag(), Owner: t.Client, Rules: t.Identity, Reserved: t.ReservedUsers}
}

// describe names t's backend in messages.
func (t target) describe() string { return describeKey(t.Key()) }

// describeKey names the backend of a target key in messages.
func describeKey(key string) string {
	ns, cp, _ := strings.Cut(key, "/")
	if cp == "" {
		return "the static backend"
	}
	return fmt.Sprintf("control plane %s/%s", ns, cp)
}

// tag names t's backend in token names.
func (t target) tag() string {
	if t.ControlPlane == "" {
		return "static"
	}
	return t.Namespace + "_" + t.ControlPlane
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

// backendOf is the backend a target key names (namespace and control
// plane only).
func backendOf(key string) backend.Backend {
	ns, cp, _ := strings.Cut(key, "/")
	return backend.Backend{Namespace: ns, ControlPlane: cp}
}

// errMessage is the message of an error that may be a Kubernetes status.
func errMessage(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Message
	}
	return err.Error()
}

// backendKey is the target key of an object: its namespace and the control
// plane its label names ("" for the static backend).
func backendKey(o watchcache.Object) string {
	return o.GetNamespace() + "/" + o.GetLabels()[aggv1.LabelControlPlane]
}

// shown is what a viewer sees of objects: whether they may read each, and
// whether they see its restricted fields. failed holds, by backend key,
// the backends whose coderd could not answer; their objects are unread.
type shown struct {
	read, full []bool
	failed     map[string]error
}

// shownTo answers, for each object, what its backend's caller sees of
// it; objects of backends without a caller are shown whole. Backends
// quick says are down are answered from what the identity service
// remembers only.
func (r *genericStore) shownTo(ctx context.Context, cs callers, objs []watchcache.Object) shown {
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
			read, full, err := answer(r.quick(ctx, p.key), c, p.items)
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
	d := r.shownTo(ctx, cs, objs)
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
	d := r.shownTo(ctx, callers{t.Key(): c}, []watchcache.Object{obj})
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

// mayWrite refuses a write coderd would refuse the caller (asked before
// anything is written, so a dry run answers as the write would, and so
// that a change of Kubernetes metadata alone, which coderd never sees,
// needs what a change in Coder needs), and returns t acting as the caller.
// A cluster controller may delete and update (its updates are checked for
// spec changes by specChange).
func (r *genericStore) mayWrite(ctx context.Context, t target, cur watchcache.Object, action codersdk.RBACAction) (target, error) {
	if t.controller != nil {
		return t, nil
	}
	if t.caller == nil {
		return t, nil
	}
	oc, ok := r.access.checks(cur)
	if !ok {
		return t, apierrors.NewInternalError(fmt.Errorf("%s %s carries no Coder IDs to authorize", r.kind, cur.GetName()))
	}
	c := oc.update
	if action != codersdk.ActionUpdate {
		c = oc.read
		c.Action = action
	}
	if err := r.mayDo(ctx, t, c, cur.GetName()); err != nil {
		return t, err
	}
	return t.acting(), nil
}

// controllerRefused is the 403 of a cluster controller's write beyond
// reading, deleting and changing Kubernetes metadata.
func (r *genericStore) controllerRefused(t target, name, what string) error {
	return apierrors.NewForbidden(r.gr, name, fmt.Errorf("Kubernetes user %q is one of the cluster's controllers (aggregatedAPIServer.identity.clusterControllers), which act as coder-k8s in %s only to read, delete and change Kubernetes metadata, not to %s",
		t.controller.KubernetesUser, t.describe(), what))
}

// specChange refuses a change in Coder (a spec change) by a cluster
// controller.
func (r *genericStore) specChange(t target, name string) error {
	if t.controller == nil {
		return nil
	}
	return r.controllerRefused(t, name, "change the "+r.kind+"'s spec")
}

// mayCreate asks coderd whether the caller may create c: what a dry-run
// create answers in place of coderd's own refusal.
func (r *genericStore) mayCreate(ctx context.Context, t target, c identity.Check, name string) error {
	if t.caller == nil {
		return nil
	}
	return r.mayDo(ctx, t, c, name)
}

// mayDo asks coderd, with the caller's token, whether they may do c to
// the object called name: 403 naming their Coder user when not.
func (r *genericStore) mayDo(ctx context.Context, t target, c identity.Check, name string) error {
	got, err := t.caller.Allowed(ctx, []identity.Check{c})
	if err != nil {
		return r.coderErr(t, err, name)
	}
	if !got[0] {
		return apierrors.NewForbidden(r.gr, name, &identity.Refused{Reason: fmt.Sprintf("Coder user %q may not %s it in %s", t.caller.Username, c.Action, t.describe())})
	}
	return nil
}

// warnings collects what a list or watch tells the client in Warning
// headers (kubectl prints them): one line per reason, naming every
// backend it applies to.
type warnings struct {
	mu     sync.Mutex
	byWhy  map[string][]string
	reason []string
}

func (w *warnings) add(why, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byWhy == nil {
		w.byWhy = map[string][]string{}
	}
	if _, ok := w.byWhy[why]; !ok {
		w.reason = append(w.reason, why)
	}
	w.byWhy[why] = append(w.byWhy[why], what)
}

// send adds the warnings to the response.
func (w *warnings) send(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, why := range w.reason {
		what := w.byWhy[why]
		sort.Strings(what)
		warning.AddWarning(ctx, "", why+": "+strings.Join(dedupe(what), "; "))
	}
}

func dedupe(s []string) []string {
	out := s[:0:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
