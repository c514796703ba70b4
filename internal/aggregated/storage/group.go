package storage

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// codergroups: the groups of every organization of a coderd, named
// <org>.<group>. Groups are Enterprise routes behind template_rbac
// (enterprise/coderd/coderd.go: /api/v2/groups and
// /api/v2/organizations/{organization}/groups, both behind
// templateRBACEnabledMW): the open-source build answers 404 "Route not
// found.", an Enterprise build without the feature 403 "Template RBAC is
// a Premium feature". Such a coderd has no groups to show (an empty
// list, a 404 per name), and every write is refused with the 422 of the
// licensed template settings, before coderd is asked to change anything.
// Reads are the operator's, shown to a mapped caller as coderd's group
// ACL says (a group's members may read it; organization members may
// read the organization's groups).

// GroupStorage serves codergroups.
type GroupStorage struct {
	genericStore
	// coderd deletes a group at once.
	deletedAtOnce[*aggv1.CoderGroup]
	orgs     orgIDs
	features featureCache
}

// NewGroups returns the codergroups storage. Run must run for watches to
// see changes.
func NewGroups(o Options) (*GroupStorage, error) {
	s := &GroupStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("codergroups"),
			kind:     "CoderGroup",
			backends: o.Backends,
			ident:    o.Identity,
			access:   groupAccess,
			log:      o.Log.WithName("codergroups"),
			fields: map[string]string{
				"name":            "metadata.name",
				"display_name":    "spec.displayName",
				"avatar_url":      "spec.avatarURL",
				"quota_allowance": "spec.quotaAllowance",
				"add_users":       "spec.members",
				"remove_users":    "spec.members",
			},
		},
		features: newFeatureCache(),
	}
	if err := startCache(&s.genericStore, o, s.listGroups, aggv1.GroupFields); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *GroupStorage) New() runtime.Object     { return &aggv1.CoderGroup{} }
func (s *GroupStorage) NewList() runtime.Object { return &aggv1.CoderGroupList{} }
func (s *GroupStorage) GetSingularName() string { return "codergroup" }
func (s *GroupStorage) ShortNames() []string    { return []string{"cgrp"} }

var groupAccess = access{
	checks: func(o watchcache.Object) (objectChecks, bool) {
		g := o.(*aggv1.CoderGroup)
		id, err1 := uuid.Parse(g.Status.ID)
		org, err2 := uuid.Parse(g.Status.OrganizationID)
		if err1 != nil || err2 != nil {
			return objectChecks{}, false
		}
		// By ID, so that coderd applies the group's ACL (its members
		// may read it), unless the caller may read every group of the
		// organization.
		read := identity.Check{Resource: codersdk.ResourceGroup, Action: codersdk.ActionRead, OrganizationID: org, ResourceID: id}
		update := read
		update.Action = codersdk.ActionUpdate
		readAll := identity.Check{Resource: codersdk.ResourceGroup, Action: codersdk.ActionRead, OrganizationID: org}
		return objectChecks{read: read, update: update, readAll: &readAll}, true
	},
	// Nothing of a group is for its editors only.
	redact: func(o watchcache.Object) watchcache.Object { return o },
}

const groupsFeature = codersdk.FeatureTemplateRBAC

// noGroups is the answer of a coderd without template_rbac to a group
// read.
func noGroups(err error) bool { return coderapi.IsFeatureUnavailable(err) }

// listGroups reads every group of one coderd (GET /api/v2/groups, one
// request with the members). A coderd without template_rbac has none.
func (s *GroupStorage) listGroups(ctx context.Context, t target) ([]watchcache.Object, error) {
	started := time.Now()
	gs, err := t.Client.Groups(ctx, codersdk.GroupArguments{})
	if noGroups(err) {
		gs, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list groups: %w", err)
	}
	out := make([]watchcache.Object, 0, len(gs))
	for i := range gs {
		if obj := toGroup(t, &gs[i]); obj != nil {
			out = append(out, obj)
		}
	}
	if err := s.mergeListed(ctx, t, out, started, true, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// toGroup is the Kubernetes view of group g; nil for a group whose name
// cannot be part of an object name. Deterministic: members sorted.
func toGroup(t target, g *codersdk.Group) *aggv1.CoderGroup {
	n := groupObjectName{ControlPlane: t.ControlPlane, Org: g.OrganizationName, Name: g.Name}
	if _, err := parseGroupName(n.String(false)); err != nil {
		return nil
	}
	members := make([]string, 0, len(g.Members))
	for _, m := range g.Members {
		members = append(members, m.Username)
	}
	slices.Sort(members)
	quota := int32(g.QuotaAllowance)
	return &aggv1.CoderGroup{
		TypeMeta: metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderGroup"},
		// coderd keeps no creation time of a group.
		ObjectMeta: coderObjectMeta(t, n.String(t.prefixed), g.ID.String(), time.Time{}, objectLabels(t, g.OrganizationName, nil)),
		Spec: aggv1.CoderGroupSpec{
			Organization:   g.OrganizationName,
			DisplayName:    new(g.DisplayName),
			AvatarURL:      new(g.AvatarURL),
			Members:        members,
			QuotaAllowance: &quota,
		},
		Status: aggv1.CoderGroupStatus{
			ID:             g.ID.String(),
			OrganizationID: g.OrganizationID.String(),
			Source:         string(g.Source),
			MemberCount:    int32(g.TotalMemberCount),
		},
	}
}

func (s *GroupStorage) lookup(ctx context.Context, name string) (target, groupObjectName, error) {
	return lookupName(ctx, &s.genericStore, name, parseGroupName)
}

// fetch reads the group an object name refers to (as t: the operator
// for reads). A coderd without groups has none of that name.
func (s *GroupStorage) fetch(ctx context.Context, t target, n groupObjectName, name string) (codersdk.Group, error) {
	orgID, err := s.orgs.get(ctx, t, n.Org)
	if err != nil {
		return codersdk.Group{}, s.coderErr(t, err, name)
	}
	g, err := t.Client.GroupByOrgAndName(ctx, orgID, n.Name)
	switch {
	case noGroups(err):
		return g, s.notFound(name, fmt.Sprintf("coderd has no groups without Coder's %q feature", groupsFeature))
	case coderapi.IsNotFound(err):
		s.cache.Delete(t.Key(), name)
		return g, s.notFound(name, fmt.Sprintf("organization %s has no group %s", n.Org, n.Name))
	case err != nil:
		return g, s.coderErr(t, err, name)
	}
	if g.OrganizationName == "" {
		g.OrganizationName = n.Org
	}
	return g, nil
}

// readCoder reads one group from coderd: Coder's view, without its
// Kubernetes metadata.
func (s *GroupStorage) readCoder(ctx context.Context, t target, n groupObjectName, name string) (*aggv1.CoderGroup, error) {
	g, err := s.fetch(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	obj := toGroup(t, &g)
	if obj == nil {
		return nil, s.notFound(name, "the group is not served")
	}
	return obj, nil
}

// read fetches one group, merges its record and records it in the cache.
func (s *GroupStorage) read(ctx context.Context, t target, n groupObjectName, name string) (*aggv1.CoderGroup, error) {
	obj, err := s.readCoder(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderGroup), nil
}

// Get reads the group from coderd.
func (s *GroupStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	return getObject(ctx, s, name)
}

// List reads the groups of the namespace (or every namespace).
func (s *GroupStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// Writes. A create makes the group (POST
// /api/v2/organizations/{org}/groups) and then its members (PATCH
// /api/v2/groups/{group}: coderd's create takes none); an update PATCHes
// what the spec sets and changes; a delete deletes it. All act as the
// caller: coderd decides.

func (s *GroupStorage) validateCreate(g *aggv1.CoderGroup) (groupObjectName, field.ErrorList) {
	if g.Name == "" && g.GenerateName != "" {
		return groupObjectName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names map to Coder objects; give metadata.name")}
	}
	n, err := parseGroupName(g.Name)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, g.Name, err.Error())}
	}
	var errs field.ErrorList
	if g.Spec.Organization != "" && g.Spec.Organization != n.Org {
		errs = append(errs, field.Invalid(specPath.Child("organization"), g.Spec.Organization, "must match the organization in the name ("+n.Org+")"))
	}
	if n.Name == "Everyone" || n.Name == "new" || n.Name == "create" {
		errs = append(errs, field.Invalid(namePath, g.Name, fmt.Sprintf("%q is a name Coder reserves", n.Name)))
	}
	return n, append(errs, validateGroupSpec(&g.Spec)...)
}

func validateGroupSpec(spec *aggv1.CoderGroupSpec) field.ErrorList {
	var errs field.ErrorList
	if spec.QuotaAllowance != nil && *spec.QuotaAllowance < 0 {
		errs = append(errs, field.Invalid(specPath.Child("quotaAllowance"), *spec.QuotaAllowance, "must be at least 0"))
	}
	seen := map[string]bool{}
	for i, m := range spec.Members {
		p := specPath.Child("members").Index(i)
		if err := checkCoderName("member", m, coderName, maxCoderName, "letters, digits and single hyphens"); err != nil {
			errs = append(errs, field.Invalid(p, m, "must be a Coder username"))
		}
		if seen[m] {
			errs = append(errs, field.Duplicate(p, m))
		}
		seen[m] = true
	}
	if err := checkInNameOrder(specPath.Child("members"), spec.Members); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (s *GroupStorage) createdView(g *aggv1.CoderGroup, t target, n groupObjectName) *aggv1.CoderGroup {
	dry := g.DeepCopy()
	dry.Namespace = t.Namespace
	dry.Spec.Organization = n.Org
	dry.Labels = objectLabels(t, n.Org, nil)
	dry.CreationTimestamp = metav1.Now()
	dry.Status = aggv1.CoderGroupStatus{Source: string(codersdk.GroupSourceUser)}
	if dry.Spec.DisplayName == nil {
		dry.Spec.DisplayName = new("")
	}
	if dry.Spec.AvatarURL == nil {
		dry.Spec.AvatarURL = new("")
	}
	if dry.Spec.QuotaAllowance == nil {
		dry.Spec.QuotaAllowance = new(int32(0))
	}
	dry.Spec.Members = sortedMembers(dry.Spec.Members)
	dry.Status.MemberCount = int32(len(dry.Spec.Members))
	return dry
}

// sortedMembers is members as a read shows them: sorted, nil when none.
func sortedMembers(members []string) []string {
	if len(members) == 0 {
		return nil
	}
	out := slices.Clone(members)
	slices.Sort(out)
	return out
}

// planCreate refuses a create on a coderd without template_rbac (422),
// checks the organization, the name and the members as coderd would,
// and returns the create; a dry run asks coderd whether the caller may
// create groups in the organization instead.
func (s *GroupStorage) planCreate(ctx context.Context, t target, n groupObjectName, g, dry *aggv1.CoderGroup, dryRun bool) (createCall, error) {
	if err := s.requireFeature(ctx, &s.features, t, groupsFeature, g.Name, namePath); err != nil {
		return nil, err
	}
	orgID, err := s.orgs.get(ctx, t, n.Org)
	if err != nil {
		return nil, s.coderErr(t, err, g.Name)
	}
	switch _, err := t.Client.GroupByOrgAndName(ctx, orgID, n.Name); {
	case err == nil:
		return nil, apierrors.NewAlreadyExists(s.gr, g.Name)
	case !coderapi.IsNotFound(err):
		return nil, s.writeErr(t, err, g.Name, namePath)
	}
	ids, err := s.memberIDs(ctx, t, g.Spec.Members, g.Name)
	if err != nil {
		return nil, err
	}
	if dryRun {
		if err := s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceGroup, Action: codersdk.ActionCreate, OrganizationID: orgID}, g.Name); err != nil {
			return nil, err
		}
		dry.Status.OrganizationID = orgID.String()
		return nil, nil
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		req := codersdk.CreateGroupRequest{Name: n.Name}
		if g.Spec.DisplayName != nil {
			req.DisplayName = *g.Spec.DisplayName
		}
		if g.Spec.AvatarURL != nil {
			req.AvatarURL = *g.Spec.AvatarURL
		}
		if g.Spec.QuotaAllowance != nil {
			req.QuotaAllowance = int(*g.Spec.QuotaAllowance)
		}
		created, err := t.Client.CreateGroup(ctx, orgID, req)
		if err != nil {
			if coderapi.IsFeatureUnavailable(err) {
				return nil, nil, s.writeErr(t, err, g.Name, namePath)
			}
			return nil, nil, s.createErr(t, err, g.Name)
		}
		if len(ids) > 0 {
			add := make([]string, 0, len(ids))
			for _, id := range ids {
				add = append(add, id.String())
			}
			if created, err = t.Client.PatchGroup(ctx, created.ID, codersdk.PatchGroupRequest{AddUsers: add}); err != nil {
				// The group exists: say so, and that applying again adds
				// the members.
				return nil, nil, apierrors.NewInternalError(fmt.Errorf("group %s was created, but adding its members failed (apply again to add them): %s", g.Name, errMessage(s.coderErr(t, err, g.Name))))
			}
		}
		if created.OrganizationName == "" {
			created.OrganizationName = n.Org
		}
		out := toGroup(t, &created)
		if out == nil {
			return nil, nil, apierrors.NewInternalError(fmt.Errorf("coderd created group %q, which cannot be served", created.Name))
		}
		return out, nil, nil
	}, nil
}

// memberIDs resolves usernames to Coder user IDs, as the caller: a
// username coderd does not know (or does not show them) is a 422.
func (s *GroupStorage) memberIDs(ctx context.Context, t target, usernames []string, name string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(usernames))
	var errs field.ErrorList
	for i, u := range usernames {
		got, err := t.Client.User(ctx, u)
		switch {
		case coderapi.IsNotFound(err) || coderapi.StatusCode(err) == 400:
			errs = append(errs, field.NotFound(specPath.Child("members").Index(i), u))
		case err != nil:
			return nil, s.coderErr(t, err, name)
		default:
			ids = append(ids, got.ID)
		}
	}
	if len(errs) > 0 {
		return nil, s.invalid(name, errs)
	}
	return ids, nil
}

// writeErr is coderErr for a write, with coderd's "no such feature"
// answers as the 422 naming template_rbac.
func (s *GroupStorage) writeErr(t target, err error, name string, p *field.Path) error {
	if e := s.unlicensedErr(t, err, groupsFeature, name, p); e != nil {
		return e
	}
	return s.coderErr(t, err, name)
}

// Create makes the group and its members in Coder.
func (s *GroupStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	return createObject(ctx, s, obj, createValidation, opts)
}

// Update changes the group's display name, avatar, quota allowance and
// members (or only its Kubernetes metadata). With forceAllowCreate
// (server-side apply) a missing group is created.
func (s *GroupStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

func (s *GroupStorage) validateUpdate(next, cur *aggv1.CoderGroup, name string) field.ErrorList {
	errs := validateSameObject("group", name, next.Name, cur.Spec.Organization, next.Spec.Organization)
	return append(errs, validateGroupSpec(&next.Spec)...)
}

// groupChange is what an update of cur to next asks coderd to change:
// the fields next sets to another value, and the members to add and
// remove (by username).
func groupChange(cur, next *aggv1.CoderGroupSpec) (req codersdk.PatchGroupRequest, add, remove []string, changed bool) {
	differs := func(n, c *string) bool { return n != nil && (c == nil || *n != *c) }
	if differs(next.DisplayName, cur.DisplayName) {
		req.DisplayName, changed = new(*next.DisplayName), true
	}
	if differs(next.AvatarURL, cur.AvatarURL) {
		req.AvatarURL, changed = new(*next.AvatarURL), true
	}
	if next.QuotaAllowance != nil && (cur.QuotaAllowance == nil || *next.QuotaAllowance != *cur.QuotaAllowance) {
		req.QuotaAllowance, changed = new(int(*next.QuotaAllowance)), true
	}
	if next.Members != nil {
		for _, m := range next.Members {
			if !slices.Contains(cur.Members, m) {
				add = append(add, m)
			}
		}
		for _, m := range cur.Members {
			if !slices.Contains(next.Members, m) {
				remove = append(remove, m)
			}
		}
		changed = changed || len(add)+len(remove) > 0
	}
	return req, add, remove, changed
}

// planUpdate PATCHes the group as the caller. Refused (422) on a coderd
// without template_rbac, though it cannot have groups: its answer would
// be 404 for the route, which says nothing of the object.
func (s *GroupStorage) planUpdate(n groupObjectName, name string, cur, next *aggv1.CoderGroup) specUpdate {
	req, add, remove, changed := groupChange(&cur.Spec, &next.Spec)
	u := specUpdate{changed: changed}
	u.check = func(ctx context.Context, w *write) (bool, error) {
		if !changed {
			return false, nil
		}
		if err := s.requireFeature(ctx, &s.features, w.t, groupsFeature, name, specPath); err != nil {
			return false, err
		}
		// Members to add must exist: checked on a dry run too.
		_, err := s.memberIDs(ctx, w.t, add, name)
		return false, err
	}
	u.apply = func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		ids, err := s.memberIDs(ctx, w.t, add, name)
		if err != nil {
			return nil, nil, err
		}
		for _, id := range ids {
			req.AddUsers = append(req.AddUsers, id.String())
		}
		if len(remove) > 0 {
			// The IDs of the members to remove: the group's now. One
			// coderd no longer lists is gone already.
			g, err := s.fetch(ctx, w.t, n, name)
			if err != nil {
				return nil, nil, err
			}
			for _, gm := range g.Members {
				if slices.Contains(remove, gm.Username) {
					req.RemoveUsers = append(req.RemoveUsers, gm.ID.String())
				}
			}
		}
		if _, err := w.t.Client.PatchGroup(ctx, groupID(cur), req); err != nil {
			return nil, nil, s.writeErr(w.t, err, name, specPath)
		}
		out, err := s.readCoder(ctx, w.t, n, name)
		return out, nil, err
	}
	return u
}

// releaseDelete deletes the group: the last finalizer holding its
// deletion is gone.
func (s *GroupStorage) releaseDelete(ctx context.Context, w *write, _ groupObjectName, name string, cur, next *aggv1.CoderGroup, dryRun bool) (runtime.Object, error) {
	return releaseAtOnce(ctx, w, cur, next, dryRun, func(ctx context.Context) error { return s.deleteGroup(ctx, w.t, cur, name) })
}

// Delete deletes the group in Coder.
func (s *GroupStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return deleteObject(ctx, s, name, deleteValidation, opts)
}

func (s *GroupStorage) deleteInCoder(ctx context.Context, w *write, _ groupObjectName, name string, cur *aggv1.CoderGroup) (runtime.Object, bool, error) {
	return deleteAtOnce(ctx, w, cur, func(ctx context.Context) error { return s.deleteGroup(ctx, w.t, cur, name) })
}

func (s *GroupStorage) deleteGroup(ctx context.Context, t target, cur *aggv1.CoderGroup, name string) error {
	err := t.Client.DeleteGroup(ctx, groupID(cur))
	switch {
	case err == nil, coderapi.IsNotFound(err) && !noGroups(err):
	default:
		return s.writeErr(t, err, name, namePath)
	}
	s.cache.Delete(t.Key(), name)
	return nil
}

// groupID is the Coder ID of a served group.
func groupID(g *aggv1.CoderGroup) uuid.UUID {
	id, _ := uuid.Parse(g.Status.ID)
	return id
}
