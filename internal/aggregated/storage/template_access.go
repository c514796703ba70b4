package storage

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/warning"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// A template's access list (spec.access) is coderd's template ACL
// (enterprise/coderd/templates.go in coder v2.30.0: GET and PATCH
// /api/v2/templates/{id}/acl, 404 on the open-source build and 403
// "Premium feature" without the template_rbac feature). It is one of the
// template's licensed settings (the "access" entry of templateSettings),
// so its refusal where coderd lacks the feature is theirs. What the spec
// lists is the list: a write sends the PATCH that makes Coder's ACL
// exactly the spec, deleting (role "") what it leaves out.
//
// Without template_rbac coderd cannot show its list, but its default is
// known: a template is created with the organization's Everyone group
// (whose group ID is the organization's ID) as use, and the open-source
// RBAC policy honours that entry as the licensed one does. So there an
// unset spec.access reads as unset, and only that default, everyone: use
// and nothing else, is accepted (as equal to Coder's value).

// defaultAccess is the access list coderd gives a new template
// (postTemplateByOrganization without disable_everyone_group_access).
var defaultAccess = aggv1.TemplateAccess{Everyone: aggv1.TemplateRoleUse}

// accessTTL is how long the poller serves a template's access list
// before asking coderd again: a template's ACL is one request per
// template, which every poll would otherwise cost, and its change does
// not move the template's updated_at. A get and every write read it
// fresh.
const accessTTL = time.Minute

// templateACLs remembers templates' access lists for the poller.
type templateACLs struct {
	coderdFacts[uuid.UUID, codersdk.TemplateACL]
}

func newTemplateACLs() templateACLs {
	return templateACLs{coderdFacts[uuid.UUID, codersdk.TemplateACL]{ttl: accessTTL, max: 10000}}
}

// accessOf is what spec's access list is taken to be: the one shown, or
// coderd's default where coderd cannot show it.
func accessOf(spec *aggv1.CoderTemplateSpec) *aggv1.TemplateAccess {
	if spec.Access == nil {
		return &defaultAccess
	}
	return spec.Access
}

// accessDiffers reports whether next sets another access list than cur
// has (the templateSettings entry's differs).
func accessDiffers(next, cur *aggv1.CoderTemplateSpec) bool {
	if next.Access == nil {
		return false
	}
	a, b := next.Access, accessOf(cur)
	return a.Everyone != b.Everyone || !sameEntries(a.Users, b.Users) || !sameEntries(a.Groups, b.Groups)
}

// sameEntries compares two access lists as sets.
func sameEntries(a, b []aggv1.TemplateAccessEntry) bool {
	if len(a) != len(b) {
		return false
	}
	roles := make(map[string]aggv1.TemplateRole, len(a))
	for _, e := range a {
		roles[e.Name] = e.Role
	}
	for _, e := range b {
		if r, ok := roles[e.Name]; !ok || r != e.Role {
			return false
		}
	}
	return true
}

// sortedAccess is a copy of a with its entries in name order, as a read
// shows them (coderd answers in no fixed order); nil for nil.
func sortedAccess(a *aggv1.TemplateAccess) *aggv1.TemplateAccess {
	if a == nil {
		return nil
	}
	out := a.DeepCopy()
	byName := func(x, y aggv1.TemplateAccessEntry) int { return cmp.Compare(x.Name, y.Name) }
	slices.SortFunc(out.Users, byName)
	slices.SortFunc(out.Groups, byName)
	return out
}

// toAccess is the spec.access of coderd's ACL of a template of
// organization orgID: the Everyone group (ID orgID) as everyone, the
// others by name. Entries whose actions match no role (role "") give no
// role and are left out.
func toAccess(acl codersdk.TemplateACL, orgID uuid.UUID) *aggv1.TemplateAccess {
	out := &aggv1.TemplateAccess{}
	for _, u := range acl.Users {
		if u.Role != codersdk.TemplateRoleDeleted {
			out.Users = append(out.Users, aggv1.TemplateAccessEntry{Name: u.Username, Role: aggv1.TemplateRole(u.Role)})
		}
	}
	for _, g := range acl.Groups {
		switch {
		case g.Role == codersdk.TemplateRoleDeleted:
		case g.ID == orgID:
			out.Everyone = aggv1.TemplateRole(g.Role)
		default:
			out.Groups = append(out.Groups, aggv1.TemplateAccessEntry{Name: g.Name, Role: aggv1.TemplateRole(g.Role)})
		}
	}
	return sortedAccess(out)
}

// showAccess sets obj's spec.access to Coder's ACL of tpl when coderd has
// template_rbac (otherwise it cannot tell, and leaves it unset). fresh
// asks coderd; otherwise (the poller) an ACL read within accessTTL is
// served.
func (s *TemplateStorage) showAccess(ctx context.Context, t target, obj *aggv1.CoderTemplate, tpl *codersdk.Template, fresh bool) error {
	f, err := s.features.get(ctx, t)
	if err != nil {
		return err
	}
	if !f.enabled[codersdk.FeatureTemplateRBAC] {
		return nil
	}
	coderd := t.coderdKey()
	acl, ok := s.acls.known(coderd, tpl.ID)
	if fresh || !ok {
		acl, err = t.Client.TemplateACL(ctx, tpl.ID)
		if coderapi.IsFeatureUnavailable(err) {
			// The license ended since the features were read: coderd
			// can no longer tell.
			return nil
		}
		if err != nil {
			return fmt.Errorf("access list of template %s: %w", tpl.Name, err)
		}
		s.acls.put(coderd, tpl.ID, acl)
	}
	obj.Spec.Access = toAccess(acl, tpl.OrganizationID)
	return nil
}

// validateAccess checks a spec.access before coderd is asked.
func validateAccess(a *aggv1.TemplateAccess) field.ErrorList {
	fp := specPath.Child("access")
	roles := []aggv1.TemplateRole{aggv1.TemplateRoleUse, aggv1.TemplateRoleAdmin}
	var errs field.ErrorList
	if a.Everyone != "" && !slices.Contains(roles, a.Everyone) {
		errs = append(errs, field.NotSupported(fp.Child("everyone"), a.Everyone, roles))
	}
	check := func(list []aggv1.TemplateAccessEntry, lp *field.Path) {
		seen := map[string]bool{}
		for i, e := range list {
			switch {
			case e.Name == "":
				errs = append(errs, field.Required(lp.Index(i).Child("name"), ""))
			case seen[e.Name]:
				errs = append(errs, field.Duplicate(lp.Key(e.Name), e.Name))
			}
			seen[e.Name] = true
			if !slices.Contains(roles, e.Role) {
				errs = append(errs, field.NotSupported(lp.Key(e.Name).Child("role"), e.Role, roles))
			}
		}
		names := make([]string, len(list))
		for i, e := range list {
			names[i] = e.Name
		}
		if err := checkInNameOrder(lp, names); err != nil {
			errs = append(errs, err)
		}
	}
	check(a.Users, fp.Child("users"))
	check(a.Groups, fp.Child("groups"))
	for _, g := range a.Groups {
		if strings.EqualFold(g.Name, everyoneGroup) {
			errs = append(errs, field.Invalid(fp.Child("groups").Key(g.Name), g.Name, "the organization's Everyone group is spec.access.everyone"))
		}
	}
	return errs
}

// everyoneGroup is the name coderd reserves for an organization's group
// of all its members.
const everyoneGroup = "Everyone"

// accessIDs are the Coder IDs of the users and groups a spec.access
// names.
type accessIDs struct {
	users, groups map[string]uuid.UUID
}

// resolveAccess finds the IDs of the users and groups a names in t's
// coderd, before anything changes: a name Coder does not know (or the
// caller may not see) is a 422 naming the entry.
func (s *TemplateStorage) resolveAccess(ctx context.Context, t target, orgID uuid.UUID, a *aggv1.TemplateAccess, name string) (accessIDs, error) {
	ids := accessIDs{users: map[string]uuid.UUID{}, groups: map[string]uuid.UUID{}}
	fp := specPath.Child("access")
	var errs field.ErrorList
	for _, e := range a.Users {
		u, err := t.Client.User(ctx, e.Name)
		switch {
		// coderd answers an unknown username with 400 (ExtractUserContext);
		// a name that is a UUID or "me" would find someone else.
		case err == nil && u.Username == e.Name:
			ids.users[e.Name] = u.ID
		case err == nil && strings.EqualFold(u.Username, e.Name):
			errs = append(errs, field.Invalid(fp.Child("users").Key(e.Name), e.Name, fmt.Sprintf("Coder spells this username %q", u.Username)))
		case err == nil || coderapi.StatusCode(err) == http.StatusBadRequest || coderapi.StatusCode(err) == http.StatusNotFound:
			errs = append(errs, field.NotFound(fp.Child("users").Key(e.Name), e.Name))
		default:
			return ids, s.coderErr(t, fmt.Errorf("user %q: %w", e.Name, err), name)
		}
	}
	// One request per group: the organization's list would load every
	// group's members, the Everyone group's included.
	for _, e := range a.Groups {
		g, err := t.Client.GroupByOrgAndName(ctx, orgID, e.Name)
		switch {
		case err == nil:
			ids.groups[e.Name] = g.ID
		case coderapi.StatusCode(err) == http.StatusNotFound:
			errs = append(errs, field.NotFound(fp.Child("groups").Key(e.Name), e.Name))
		default:
			return ids, s.coderErr(t, fmt.Errorf("group %q: %w", e.Name, err), name)
		}
	}
	if len(errs) > 0 {
		return ids, s.invalid(name, errs)
	}
	return ids, nil
}

// aclPatch is the PATCH that makes cur, the ACL of a template of
// organization orgID, exactly a: what a sets or changes, and role ""
// (delete) for what cur has and a leaves out.
func aclPatch(a *aggv1.TemplateAccess, ids accessIDs, cur codersdk.TemplateACL, orgID uuid.UUID) codersdk.UpdateTemplateACL {
	wantUsers := map[string]codersdk.TemplateRole{}
	for _, e := range a.Users {
		wantUsers[ids.users[e.Name].String()] = codersdk.TemplateRole(e.Role)
	}
	wantGroups := map[string]codersdk.TemplateRole{}
	if a.Everyone != "" {
		wantGroups[orgID.String()] = codersdk.TemplateRole(a.Everyone)
	}
	for _, e := range a.Groups {
		wantGroups[ids.groups[e.Name].String()] = codersdk.TemplateRole(e.Role)
	}
	haveUsers := map[string]codersdk.TemplateRole{}
	for _, u := range cur.Users {
		haveUsers[u.ID.String()] = u.Role
	}
	haveGroups := map[string]codersdk.TemplateRole{}
	for _, g := range cur.Groups {
		haveGroups[g.ID.String()] = g.Role
	}
	return codersdk.UpdateTemplateACL{UserPerms: permsPatch(wantUsers, haveUsers), GroupPerms: permsPatch(wantGroups, haveGroups)}
}

// permsPatch is the map of an ACL PATCH that turns have into want; nil
// when they agree. An entry of have whose role is "" (actions that
// match no role) is deleted too.
func permsPatch(want, have map[string]codersdk.TemplateRole) map[string]codersdk.TemplateRole {
	out := map[string]codersdk.TemplateRole{}
	for id, r := range want {
		if cur, ok := have[id]; !ok || cur != r {
			out[id] = r
		}
	}
	for id := range have {
		if _, ok := want[id]; !ok {
			out[id] = codersdk.TemplateRoleDeleted
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// setAccess makes Coder's ACL of template id (of organization orgID)
// exactly a, reading it first so that the PATCH deletes what a leaves
// out; nothing is sent when it already is.
func (s *TemplateStorage) setAccess(ctx context.Context, t target, id, orgID uuid.UUID, a *aggv1.TemplateAccess, ids accessIDs) error {
	cur, err := t.Client.TemplateACL(ctx, id)
	if err != nil {
		return fmt.Errorf("read the access list: %w", err)
	}
	req := aclPatch(a, ids, cur, orgID)
	if req.UserPerms == nil && req.GroupPerms == nil {
		return nil
	}
	if err := t.Client.UpdateTemplateACL(ctx, id, req); err != nil {
		return fmt.Errorf("update the access list: %w", err)
	}
	return nil
}

// accessCreated sets spec.access on the template just created (a create
// request carries only whether Everyone may use it). The template exists
// and its record must still be saved, so a failure is a warning: the
// object shows Coder's list, and applying again sets it.
func (s *TemplateStorage) accessCreated(ctx context.Context, t target, created *codersdk.Template, spec *aggv1.CoderTemplateSpec, ids accessIDs) {
	if !accessDiffers(spec, &aggv1.CoderTemplateSpec{}) {
		return
	}
	if err := s.setAccess(ctx, t, created.ID, created.OrganizationID, spec.Access, ids); err != nil {
		s.log.Error(err, "setting the access list of a new template", "template", created.Name)
		warning.AddWarning(ctx, "", fmt.Sprintf("the template was created, but setting spec.access failed (apply it again): %s", coderapi.Message(err)))
	}
}
