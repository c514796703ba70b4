package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// orgsCoderd is an Enterprise coderd v2.30.0 entitled to template_rbac
// and multiple_organizations, in front of the real open-source coderd,
// serving what the open-source build cannot (its routes are 404 or 405
// there), as enterprise/coderd does:
//   - groups (enterprise/coderd/groups.go): GET /api/v2/groups, POST and
//     GET /api/v2/organizations/{organization}/groups, GET
//     .../groups/{groupName}, GET, PATCH and DELETE /api/v2/groups/{group}.
//     Each organization has its Everyone group (ID = the organization's,
//     members = the organization's, unchangeable); members are added and
//     removed by user ID and must be members of the organization.
//   - organizations (enterprise/coderd/organizations.go): POST
//     /api/v2/organizations, PATCH and DELETE /api/v2/organizations/{organization}.
//     Organizations made here exist only here (with their creator as the
//     only member); the real coderd's are read from it.
//
// Everything else goes to the real coderd with the caller's token.
type orgsCoderd struct {
	url    string
	target string

	mu     sync.Mutex
	groups map[uuid.UUID]*codersdk.Group
	orgs   map[uuid.UUID]*codersdk.Organization
}

var (
	orgGroupsPath  = regexp.MustCompile(`^/api/v2/organizations/([^/]+)/groups/?$`)
	orgGroupByName = regexp.MustCompile(`^/api/v2/organizations/([^/]+)/groups/([^/]+)$`)
	groupByIDPath  = regexp.MustCompile(`^/api/v2/groups/([0-9a-f-]{36})$`)
	orgPath        = regexp.MustCompile(`^/api/v2/organizations/([^/]+)$`)
	orgMembersPage = regexp.MustCompile(`^/api/v2/organizations/([^/]+)/paginated-members$`)
)

func newOrgsCoderd(t *testing.T, target string) *orgsCoderd {
	f := &orgsCoderd{target: target, groups: map[uuid.UUID]*codersdk.Group{}, orgs: map[uuid.UUID]*codersdk.Organization{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func (f *orgsCoderd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/api/v2/entitlements":
		feature := codersdk.Feature{Entitlement: codersdk.EntitlementEntitled, Enabled: true}
		writeJSON(w, http.StatusOK, codersdk.Entitlements{HasLicense: true, Features: map[codersdk.FeatureName]codersdk.Feature{
			codersdk.FeatureTemplateRBAC: feature, codersdk.FeatureMultipleOrganizations: feature}})
	case p == "/api/v2/authcheck" && r.Method == http.MethodPost:
		f.authcheck(w, r)
	case p == "/api/v2/groups" && r.Method == http.MethodGet:
		f.listGroups(w, r, uuid.Nil)
	case orgGroupsPath.MatchString(p):
		org, ok := f.org(w, r, orgGroupsPath.FindStringSubmatch(p)[1])
		if !ok {
			return
		}
		switch r.Method {
		case http.MethodGet:
			f.listGroups(w, r, org.ID)
		case http.MethodPost:
			f.createGroup(w, r, org)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	case orgGroupByName.MatchString(p) && r.Method == http.MethodGet:
		m := orgGroupByName.FindStringSubmatch(p)
		org, ok := f.org(w, r, m[1])
		if !ok {
			return
		}
		for _, g := range f.allGroups(r, org.ID) {
			if g.Name == m[2] {
				writeJSON(w, http.StatusOK, g)
				return
			}
		}
		writeJSON(w, http.StatusNotFound, codersdk.Response{Message: "Resource not found or you do not have access to this resource"})
	case groupByIDPath.MatchString(p):
		f.serveGroup(w, r, uuid.MustParse(groupByIDPath.FindStringSubmatch(p)[1]))
	case p == "/api/v2/organizations" && r.Method == http.MethodPost:
		f.createOrg(w, r)
	case p == "/api/v2/organizations" && r.Method == http.MethodGet:
		var real []codersdk.Organization
		if code, body := f.real(r, p, &real); code != http.StatusOK {
			relay(w, code, body)
			return
		}
		f.mu.Lock()
		for _, o := range f.orgs {
			real = append(real, *o)
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, real)
	case orgPath.MatchString(p) && f.own(orgPath.FindStringSubmatch(p)[1]) != nil:
		f.serveOwnOrg(w, r, f.own(orgPath.FindStringSubmatch(p)[1]))
	case orgPath.MatchString(p) && (r.Method == http.MethodPatch || r.Method == http.MethodDelete):
		// The real coderd's organizations: only the default one, which
		// enterprise coderd neither deletes nor lets this test rename.
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Default organization cannot be deleted."})
	case orgMembersPage.MatchString(p) && f.own(orgMembersPage.FindStringSubmatch(p)[1]) != nil:
		writeJSON(w, http.StatusOK, codersdk.PaginatedMembersResponse{Members: []codersdk.OrganizationMemberWithUserData{}, Count: 1})
	default:
		f.proxy(w, r)
	}
}

// real asks the real coderd for p as the caller, decoding a 200 into v.
func (f *orgsCoderd) real(r *http.Request, p string, v any) (int, []byte) {
	return (&aclCoderd{target: f.target}).real(r, p, v)
}

func (f *orgsCoderd) proxy(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	out, err := http.NewRequestWithContext(r.Context(), r.Method, f.target+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	res, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
}

// own is the organization made here that param (a name or an ID) names.
func (f *orgsCoderd) own(param string) *codersdk.Organization {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range f.orgs {
		if o.Name == param || o.ID.String() == param {
			c := *o
			return &c
		}
	}
	return nil
}

// org is httpmw.ExtractOrganizationParam: the organization param names,
// made here or the real coderd's.
func (f *orgsCoderd) org(w http.ResponseWriter, r *http.Request, param string) (codersdk.Organization, bool) {
	if o := f.own(param); o != nil {
		return *o, true
	}
	var org codersdk.Organization
	if code, body := f.real(r, "/api/v2/organizations/"+param, &org); code != http.StatusOK {
		relay(w, code, body)
		return org, false
	}
	return org, true
}

// everyone is organization org's Everyone group, its members the
// organization's (as the real coderd lists them to the caller).
func (f *orgsCoderd) everyone(r *http.Request, org codersdk.Organization) codersdk.Group {
	g := codersdk.Group{ID: org.ID, Name: "Everyone", OrganizationID: org.ID, OrganizationName: org.Name,
		OrganizationDisplayName: org.DisplayName, Source: codersdk.GroupSourceUser, Members: []codersdk.ReducedUser{}}
	if f.own(org.ID.String()) == nil {
		var members []codersdk.OrganizationMemberWithUserData
		if code, _ := f.real(r, "/api/v2/organizations/"+org.ID.String()+"/members", &members); code == http.StatusOK {
			for _, m := range members {
				g.Members = append(g.Members, codersdk.ReducedUser{MinimalUser: codersdk.MinimalUser{ID: m.UserID, Username: m.Username}})
			}
		}
	}
	g.TotalMemberCount = len(g.Members)
	return g
}

// allGroups are the groups of organization orgID (every organization's
// for uuid.Nil), Everyone groups first, as groupsByOrganization and
// groups list them.
func (f *orgsCoderd) allGroups(r *http.Request, orgID uuid.UUID) []codersdk.Group {
	var orgs []codersdk.Organization
	f.real(r, "/api/v2/organizations", &orgs)
	f.mu.Lock()
	for _, o := range f.orgs {
		orgs = append(orgs, *o)
	}
	f.mu.Unlock()
	var out []codersdk.Group
	for _, o := range orgs {
		if orgID != uuid.Nil && o.ID != orgID {
			continue
		}
		out = append(out, f.everyone(r, o))
		f.mu.Lock()
		for _, g := range f.groups {
			if g.OrganizationID == o.ID {
				c := *g
				c.Members = slices.Clone(g.Members)
				c.TotalMemberCount = len(c.Members)
				c.OrganizationName, c.OrganizationDisplayName = o.Name, o.DisplayName
				out = append(out, c)
			}
		}
		f.mu.Unlock()
	}
	return out
}

func (f *orgsCoderd) listGroups(w http.ResponseWriter, r *http.Request, orgID uuid.UUID) {
	writeJSON(w, http.StatusOK, f.allGroups(r, orgID))
}

// createGroup is postGroupByOrganization.
func (f *orgsCoderd) createGroup(w http.ResponseWriter, r *http.Request, org codersdk.Organization) {
	var req codersdk.CreateGroupRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Validation failed."})
		return
	}
	if req.Name == "Everyone" {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: fmt.Sprintf("%q is a reserved keyword and cannot be used for a group name.", req.Name)})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.groups {
		if g.OrganizationID == org.ID && g.Name == req.Name {
			writeJSON(w, http.StatusConflict, codersdk.Response{Message: fmt.Sprintf("A group named %q already exists.", req.Name)})
			return
		}
	}
	g := &codersdk.Group{ID: uuid.New(), Name: req.Name, DisplayName: req.DisplayName, AvatarURL: req.AvatarURL, QuotaAllowance: req.QuotaAllowance,
		OrganizationID: org.ID, Source: codersdk.GroupSourceUser, Members: []codersdk.ReducedUser{}}
	f.groups[g.ID] = g
	c := *g
	c.OrganizationName, c.OrganizationDisplayName = org.Name, org.DisplayName
	writeJSON(w, http.StatusCreated, c)
}

// serveGroup is group, patchGroup and deleteGroup.
func (f *orgsCoderd) serveGroup(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
	f.mu.Lock()
	g, ok := f.groups[id]
	f.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, codersdk.Response{Message: "Resource not found or you do not have access to this resource"})
		return
	}
	switch r.Method {
	case http.MethodGet:
	case http.MethodDelete:
		f.mu.Lock()
		delete(f.groups, id)
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, codersdk.Response{Message: "Successfully deleted group!"})
		return
	case http.MethodPatch:
		var req codersdk.PatchGroupRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON."})
			return
		}
		var members []codersdk.OrganizationMemberWithUserData
		if code, body := f.real(r, "/api/v2/organizations/"+g.OrganizationID.String()+"/members", &members); code != http.StatusOK {
			relay(w, code, body)
			return
		}
		byID := map[string]codersdk.ReducedUser{}
		for _, m := range members {
			byID[m.UserID.String()] = codersdk.ReducedUser{MinimalUser: codersdk.MinimalUser{ID: m.UserID, Username: m.Username}}
		}
		for _, uid := range append(slices.Clone(req.AddUsers), req.RemoveUsers...) {
			if _, err := uuid.Parse(uid); err != nil {
				writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: fmt.Sprintf("ID %q must be a valid user UUID.", uid)})
				return
			}
			if _, ok := byID[uid]; !ok {
				writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: fmt.Sprintf("User must be a member of organization %q", g.Name)})
				return
			}
		}
		f.mu.Lock()
		if req.DisplayName != nil {
			g.DisplayName = *req.DisplayName
		}
		if req.AvatarURL != nil {
			g.AvatarURL = *req.AvatarURL
		}
		if req.QuotaAllowance != nil {
			g.QuotaAllowance = *req.QuotaAllowance
		}
		for _, uid := range req.AddUsers {
			if !slices.ContainsFunc(g.Members, func(m codersdk.ReducedUser) bool { return m.ID.String() == uid }) {
				g.Members = append(g.Members, byID[uid])
			}
		}
		g.Members = slices.DeleteFunc(g.Members, func(m codersdk.ReducedUser) bool { return slices.Contains(req.RemoveUsers, m.ID.String()) })
		f.mu.Unlock()
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	for _, c := range f.allGroups(r, g.OrganizationID) {
		if c.ID == id {
			writeJSON(w, http.StatusOK, c)
			return
		}
	}
}

// removeMember removes username from group name, as Coder's UI would.
func (f *orgsCoderd) removeMember(name, username string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.groups {
		if g.Name == name {
			g.Members = slices.DeleteFunc(g.Members, func(m codersdk.ReducedUser) bool { return m.Username == username })
		}
	}
}

// group is a copy of group name, if any.
func (f *orgsCoderd) group(name string) (codersdk.Group, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.groups {
		if g.Name == name {
			c := *g
			c.Members = slices.Clone(g.Members)
			return c, true
		}
	}
	return codersdk.Group{}, false
}

// createOrg is postOrganizations: the name must be free (409), the
// display name defaults to the name.
func (f *orgsCoderd) createOrg(w http.ResponseWriter, r *http.Request) {
	var req codersdk.CreateOrganizationRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Validation failed."})
		return
	}
	var existing codersdk.Organization
	if code, _ := f.real(r, "/api/v2/organizations/"+req.Name, &existing); code == http.StatusOK || f.own(req.Name) != nil {
		writeJSON(w, http.StatusConflict, codersdk.Response{Message: "Organization already exists with that name."})
		return
	}
	if req.DisplayName == "" {
		req.DisplayName = req.Name
	}
	now := time.Now().UTC()
	o := &codersdk.Organization{MinimalOrganization: codersdk.MinimalOrganization{ID: uuid.New(), Name: req.Name, DisplayName: req.DisplayName, Icon: req.Icon},
		Description: req.Description, CreatedAt: now, UpdatedAt: now}
	f.mu.Lock()
	f.orgs[o.ID] = o
	f.mu.Unlock()
	writeJSON(w, http.StatusCreated, o)
}

// serveOwnOrg is organization, patchOrganization and deleteOrganization
// for an organization made here.
func (f *orgsCoderd) serveOwnOrg(w http.ResponseWriter, r *http.Request, o *codersdk.Organization) {
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, o)
	case http.MethodPatch:
		var req codersdk.UpdateOrganizationRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON."})
			return
		}
		f.mu.Lock()
		cur := f.orgs[o.ID]
		if req.Name != "" {
			cur.Name = req.Name
		}
		if req.DisplayName != "" {
			cur.DisplayName = req.DisplayName
		}
		if req.Description != nil {
			cur.Description = *req.Description
		}
		if req.Icon != nil {
			cur.Icon = *req.Icon
		}
		cur.UpdatedAt = time.Now().UTC()
		c := *cur
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, c)
	case http.MethodDelete:
		f.mu.Lock()
		delete(f.orgs, o.ID)
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, codersdk.Response{Message: "Organization has been deleted."})
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

// authcheck is the real coderd's POST /api/v2/authcheck, which looks a
// group's resource_id up in its database (to apply the group's ACL:
// members may read it): for the groups made here it cannot, so their
// checks are asked of it without the ID, for every group of the
// organization, and a read is also allowed to the group's members, as
// the group's ACL says (database.Group.RBACObject).
func (f *orgsCoderd) authcheck(w http.ResponseWriter, r *http.Request) {
	var req codersdk.AuthorizationRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON."})
		return
	}
	memberOf := map[string]string{} // check → the group the caller must be in
	for k, c := range req.Checks {
		if c.Object.ResourceType != codersdk.ResourceGroup || c.Object.ResourceID == "" {
			continue
		}
		id, err := uuid.Parse(c.Object.ResourceID)
		if err != nil {
			continue
		}
		f.mu.Lock()
		_, own := f.groups[id]
		f.mu.Unlock()
		if !own {
			continue
		}
		if c.Action == codersdk.ActionRead {
			memberOf[k] = c.Object.ResourceID
		}
		c.Object.ResourceID = ""
		req.Checks[k] = c
	}
	body, _ := json.Marshal(req)
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, f.target+"/api/v2/authcheck", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Accept-Encoding")
	res, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	answer, _ := io.ReadAll(res.Body)
	var got codersdk.AuthorizationResponse
	if res.StatusCode != http.StatusOK || len(memberOf) == 0 || json.Unmarshal(answer, &got) != nil {
		relay(w, res.StatusCode, answer)
		return
	}
	var me codersdk.User
	if code, _ := f.real(r, "/api/v2/users/me", &me); code == http.StatusOK {
		for k, gid := range memberOf {
			f.mu.Lock()
			g := f.groups[uuid.MustParse(gid)]
			if g != nil && slices.ContainsFunc(g.Members, func(m codersdk.ReducedUser) bool { return m.ID == me.ID }) {
				got[k] = true
			}
			f.mu.Unlock()
		}
	}
	writeJSON(w, http.StatusOK, got)
}
