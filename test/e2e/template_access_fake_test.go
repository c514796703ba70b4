package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// aclCoderd adds to licensedCoderd what coderd v2.30.0's enterprise build
// serves with template_rbac and the open-source one behind the fake
// cannot (its routes are 404 there): the template ACL
// (enterprise/coderd/templates.go: GET and PATCH
// /api/v2/templates/{template}/acl) and groups by name
// (enterprise/coderd/groups.go: GET
// /api/v2/organizations/{organization}/groups/{groupName}). Users and
// templates are the real coderd's, read as the caller: the ACL's users
// are real users, and a template the caller cannot read is coderd's own
// answer. Groups other than the organization's Everyone group (whose ID
// is the organization's) exist only here, as if made in Coder's UI.
type aclCoderd struct {
	target string

	mu sync.Mutex
	// users and groups are each template's ACL: ID → role.
	users, groups map[uuid.UUID]map[uuid.UUID]codersdk.TemplateRole
	// known are the groups besides Everyone, by name.
	known map[string]codersdk.Group
	// patches are the PATCHes each template's ACL was sent.
	patches map[uuid.UUID][]codersdk.UpdateTemplateACL
}

var (
	templateACLPath = regexp.MustCompile(`^/api/v2/templates/([0-9a-f-]{36})/acl$`)
	groupByName     = regexp.MustCompile(`^/api/v2/organizations/([^/]+)/groups/([^/]+)$`)
)

func newACLCoderd(target string) *aclCoderd {
	return &aclCoderd{target: target, users: map[uuid.UUID]map[uuid.UUID]codersdk.TemplateRole{},
		groups: map[uuid.UUID]map[uuid.UUID]codersdk.TemplateRole{}, known: map[string]codersdk.Group{},
		patches: map[uuid.UUID][]codersdk.UpdateTemplateACL{}}
}

// addGroup makes group name in organization org, as Coder's UI would.
func (a *aclCoderd) addGroup(org uuid.UUID, name string) codersdk.Group {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := codersdk.Group{ID: uuid.New(), Name: name, OrganizationID: org, Source: codersdk.GroupSourceUser, Members: []codersdk.ReducedUser{}}
	a.known[name] = g
	return g
}

// created starts the ACL of template tpl, just created, as
// postTemplateByOrganization does: the Everyone group may use it unless
// the request said disable_everyone_group_access.
func (a *aclCoderd) created(tpl codersdk.Template, private bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init(tpl, private)
}

func (a *aclCoderd) init(tpl codersdk.Template, private bool) {
	a.users[tpl.ID] = map[uuid.UUID]codersdk.TemplateRole{}
	a.groups[tpl.ID] = map[uuid.UUID]codersdk.TemplateRole{}
	if !private {
		a.groups[tpl.ID][tpl.OrganizationID] = codersdk.TemplateRoleUse
	}
}

// serve answers the routes the fake adds; false for any other request.
func (a *aclCoderd) serve(w http.ResponseWriter, r *http.Request) bool {
	if m := templateACLPath.FindStringSubmatch(r.URL.Path); m != nil && (r.Method == http.MethodGet || r.Method == http.MethodPatch) {
		a.serveACL(w, r, uuid.MustParse(m[1]))
		return true
	}
	if m := groupByName.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodGet {
		a.serveGroup(w, r, m[1], m[2])
		return true
	}
	return false
}

// real asks the real coderd for p as the caller, decoding a 200 into v;
// otherwise it returns coderd's status and body.
func (a *aclCoderd) real(r *http.Request, p string, v any) (int, []byte) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, a.target+p, nil)
	if err != nil {
		return http.StatusBadGateway, []byte(err.Error())
	}
	req.Header.Set(codersdk.SessionTokenHeader, r.Header.Get(codersdk.SessionTokenHeader))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return http.StatusBadGateway, []byte(err.Error())
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return http.StatusBadGateway, []byte(err.Error())
	}
	if res.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, v); err != nil {
			return http.StatusBadGateway, []byte(err.Error())
		}
	}
	return res.StatusCode, body
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func relay(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// serveACL is templateACL and patchTemplateACL for template id.
func (a *aclCoderd) serveACL(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
	// httpmw.ExtractTemplateParam: coderd's answer for a template the
	// caller cannot read.
	var tpl codersdk.Template
	if code, body := a.real(r, "/api/v2/templates/"+id.String(), &tpl); code != http.StatusOK {
		relay(w, code, body)
		return
	}
	a.mu.Lock()
	if _, ok := a.groups[id]; !ok {
		// Made before the fake: coderd's default.
		a.init(tpl, false)
	}
	a.mu.Unlock()
	if r.Method == http.MethodPatch {
		a.patchACL(w, r, id, tpl.OrganizationID)
		return
	}
	users, groups := a.acl(id)
	out := codersdk.TemplateACL{Users: []codersdk.TemplateUser{}, Groups: []codersdk.TemplateGroup{}}
	for uid, role := range users {
		var u codersdk.User
		if code, body := a.real(r, "/api/v2/users/"+uid.String(), &u); code != http.StatusOK {
			relay(w, code, body)
			return
		}
		out.Users = append(out.Users, codersdk.TemplateUser{User: u, Role: role})
	}
	for gid, role := range groups {
		g, ok := a.group(tpl.OrganizationID, gid)
		if !ok {
			continue // deleted since: GetTemplateGroupRoles joins the groups
		}
		g.OrganizationName = tpl.OrganizationName
		out.Groups = append(out.Groups, codersdk.TemplateGroup{Group: g, Role: role})
	}
	writeJSON(w, http.StatusOK, out)
}

// patchACL validates as acl.Validate does (UUIDs, roles, existing users
// and groups unless deleted) and applies the request: role "" deletes.
func (a *aclCoderd) patchACL(w http.ResponseWriter, r *http.Request, id, org uuid.UUID) {
	var req codersdk.UpdateTemplateACL
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON.", Detail: err.Error()})
		return
	}
	var invalid []codersdk.ValidationError
	check := func(perms map[string]codersdk.TemplateRole, field string, exists func(uuid.UUID) bool, what string) map[uuid.UUID]codersdk.TemplateRole {
		out := map[uuid.UUID]codersdk.TemplateRole{}
		for key, role := range perms {
			if role != codersdk.TemplateRoleDeleted && role != codersdk.TemplateRoleUse && role != codersdk.TemplateRoleAdmin {
				invalid = append(invalid, codersdk.ValidationError{Field: field, Detail: fmt.Sprintf("role %q is not a valid template role", role)})
			}
			uid, err := uuid.Parse(key)
			if err != nil {
				invalid = append(invalid, codersdk.ValidationError{Field: field, Detail: fmt.Sprintf("%v is not a valid UUID.", key)})
				continue
			}
			if role != codersdk.TemplateRoleDeleted && !exists(uid) {
				invalid = append(invalid, codersdk.ValidationError{Field: field, Detail: fmt.Sprintf("%s with ID %v does not exist", what, uid)})
			}
			out[uid] = role
		}
		return out
	}
	users := check(req.UserPerms, "user_perms", func(uid uuid.UUID) bool {
		var u codersdk.User
		code, _ := a.real(r, "/api/v2/users/"+uid.String(), &u)
		return code == http.StatusOK
	}, "user")
	groups := check(req.GroupPerms, "group_perms", func(gid uuid.UUID) bool {
		_, ok := a.group(org, gid)
		return ok
	}, "group")
	if len(invalid) > 0 {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Invalid request to update template ACL", Validations: invalid})
		return
	}
	a.mu.Lock()
	apply := func(dst, src map[uuid.UUID]codersdk.TemplateRole) {
		for k, role := range src {
			if role == codersdk.TemplateRoleDeleted {
				delete(dst, k)
			} else {
				dst[k] = role
			}
		}
	}
	apply(a.users[id], users)
	apply(a.groups[id], groups)
	a.patches[id] = append(a.patches[id], req)
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, codersdk.Response{Message: "Successfully updated template ACL list."})
}

// serveGroup is GET /organizations/{organization}/groups/{groupName}
// (the organization by ID, as coder-k8s asks).
func (a *aclCoderd) serveGroup(w http.ResponseWriter, r *http.Request, orgParam, name string) {
	var org codersdk.Organization
	if code, body := a.real(r, "/api/v2/organizations/"+orgParam, &org); code != http.StatusOK {
		relay(w, code, body)
		return
	}
	a.mu.Lock()
	g, ok := a.known[name]
	a.mu.Unlock()
	switch {
	case name == "Everyone":
		g, _ = a.group(org.ID, org.ID)
	case !ok || g.OrganizationID != org.ID:
		writeJSON(w, http.StatusNotFound, codersdk.Response{Message: "Resource not found or you do not have access to this resource"})
		return
	}
	g.OrganizationName = org.Name
	writeJSON(w, http.StatusOK, g)
}

// group is group gid of organization org: its Everyone group (ID org) or
// one of the known ones.
func (a *aclCoderd) group(org, gid uuid.UUID) (codersdk.Group, bool) {
	if gid == org {
		return codersdk.Group{ID: org, Name: "Everyone", OrganizationID: org, Source: codersdk.GroupSourceUser, Members: []codersdk.ReducedUser{}}, true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, g := range a.known {
		if g.ID == gid && g.OrganizationID == org {
			return g, true
		}
	}
	return codersdk.Group{}, false
}

// acl is a copy of template id's ACL.
func (a *aclCoderd) acl(id uuid.UUID) (users, groups map[uuid.UUID]codersdk.TemplateRole) {
	a.mu.Lock()
	defer a.mu.Unlock()
	users, groups = map[uuid.UUID]codersdk.TemplateRole{}, map[uuid.UUID]codersdk.TemplateRole{}
	for k, v := range a.users[id] {
		users[k] = v
	}
	for k, v := range a.groups[id] {
		groups[k] = v
	}
	return users, groups
}

// setACL replaces template id's ACL, as a change made in Coder's UI.
func (a *aclCoderd) setACL(id uuid.UUID, users, groups map[uuid.UUID]codersdk.TemplateRole) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.users[id], a.groups[id] = users, groups
}
