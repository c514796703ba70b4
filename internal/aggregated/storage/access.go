package storage

import (
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/identity"
)

// Access to Coder: what coderd must allow of a caller per kind, who the
// caller is in a backend, and what a write asks coderd before anything is
// written. What reads show is visibility.go's.

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
		return templateChecks(tpl.Status.ID, tpl.Status.OrganizationID)
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

// templateChecks are the checks of template templateID of organization
// org: what a template, and each of its versions, is shown by (coderd
// authorizes a version as its template).
func templateChecks(templateID, org string) (objectChecks, bool) {
	id, err1 := uuid.Parse(templateID)
	orgID, err2 := uuid.Parse(org)
	if err1 != nil || err2 != nil {
		return objectChecks{}, false
	}
	// By ID, so that coderd applies the template's user and group
	// ACLs; unless the caller may read every template of the
	// organization.
	read := identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionRead, ResourceID: id}
	update := read
	update.Action = codersdk.ActionUpdate
	readAll := identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionRead, OrganizationID: orgID}
	// The files are shown to those who may update every template of
	// the organization (template and organization admins, owners).
	updateAll := readAll
	updateAll.Action = codersdk.ActionUpdate
	return objectChecks{read: read, update: update, readAll: &readAll, updateAll: &updateAll}, true
}

var templateVersionAccess = access{
	checks: func(o watchcache.Object) (objectChecks, bool) {
		v := o.(*aggv1.CoderTemplateVersion)
		return templateChecks(v.Status.TemplateID, v.Status.OrganizationID)
	},
	redact: func(o watchcache.Object) watchcache.Object {
		v := o.(*aggv1.CoderTemplateVersion)
		if v.Spec.Files == nil {
			return v
		}
		c := *v
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
	mapCaller := r.ident.Caller
	if isWrite(ctx) {
		mapCaller = r.ident.CallerToWrite
	}
	c, err := mapCaller(ctx, t.coderd(), u)
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

// isWrite reports whether the request writes: its caller is mapped
// afresh when a read refused them a moment ago
// (identity.Service.CallerToWrite).
func isWrite(ctx context.Context) bool {
	info, ok := genericapirequest.RequestInfoFrom(ctx)
	if !ok {
		return false
	}
	switch info.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
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
	return apierrors.NewForbidden(r.gr, name, &identity.Refused{Reason: fmt.Sprintf("Kubernetes user %q is one of the cluster's controllers (aggregatedAPIServer.identity.clusterControllers), which act as coder-k8s in %s only to read, delete and change Kubernetes metadata, not to %s",
		t.controller.KubernetesUser, t.describe(), what)})
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
