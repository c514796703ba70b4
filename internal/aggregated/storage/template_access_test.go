package storage

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
)

func fxAccess(everyone aggv1.TemplateRole, users, groups map[string]aggv1.TemplateRole) *aggv1.TemplateAccess {
	a := &aggv1.TemplateAccess{Everyone: everyone}
	for n, r := range users {
		a.Users = append(a.Users, aggv1.TemplateAccessEntry{Name: n, Role: r})
	}
	for n, r := range groups {
		a.Groups = append(a.Groups, aggv1.TemplateAccessEntry{Name: n, Role: r})
	}
	return sortedAccess(a)
}

// The PATCH makes Coder's list exactly the spec's: new and changed
// entries set, entries the spec leaves out deleted (role ""), the
// Everyone group by the organization's ID; nothing when they agree.
func TestAccessPatch(t *testing.T) {
	org, alice, bob, carol, devs, ops := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	user := func(id uuid.UUID, name string, r codersdk.TemplateRole) codersdk.TemplateUser {
		u := codersdk.TemplateUser{Role: r}
		u.ID, u.Username = id, name
		return u
	}
	group := func(id uuid.UUID, name string, r codersdk.TemplateRole) codersdk.TemplateGroup {
		g := codersdk.TemplateGroup{Role: r}
		g.ID, g.Name = id, name
		return g
	}
	cur := codersdk.TemplateACL{
		Users:  []codersdk.TemplateUser{user(alice, "alice", "use"), user(bob, "bob", "admin"), user(carol, "carol", "")},
		Groups: []codersdk.TemplateGroup{group(org, everyoneGroup, "use"), group(devs, "devs", "use")},
	}
	ids := accessIDs{users: map[string]uuid.UUID{"alice": alice, "bob": bob}, groups: map[string]uuid.UUID{"devs": devs, "ops": ops}}

	same := fxAccess(aggv1.TemplateRoleUse, map[string]aggv1.TemplateRole{"alice": "use", "bob": "admin"}, map[string]aggv1.TemplateRole{"devs": "use"})
	got := aclPatch(same, ids, cur, org)
	// carol's entry matches no role: the list as shown lacks it, and
	// making Coder's list the spec's deletes it.
	if want := (codersdk.UpdateTemplateACL{UserPerms: map[string]codersdk.TemplateRole{carol.String(): ""}}); !reflect.DeepEqual(got, want) {
		t.Errorf("patch for the list as shown = %+v, want %+v", got, want)
	}
	cur.Users = cur.Users[:2]
	if got := aclPatch(same, ids, cur, org); got.UserPerms != nil || got.GroupPerms != nil {
		t.Errorf("patch for Coder's own list = %+v, want none", got)
	}

	next := fxAccess("", map[string]aggv1.TemplateRole{"alice": "admin"}, map[string]aggv1.TemplateRole{"ops": "use"})
	got = aclPatch(next, ids, cur, org)
	want := codersdk.UpdateTemplateACL{
		UserPerms:  map[string]codersdk.TemplateRole{alice.String(): "admin", bob.String(): ""},
		GroupPerms: map[string]codersdk.TemplateRole{org.String(): "", devs.String(): "", ops.String(): "use"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("patch = %+v, want %+v", got, want)
	}

	// The read: Everyone is spec.access.everyone, entries in name order.
	shown := toAccess(cur, org)
	if !reflect.DeepEqual(shown, same) {
		t.Errorf("shown %+v, want %+v", shown, same)
	}
}

// Unset keeps Coder's list; a list compares as a set; where coderd
// cannot show its list (no template_rbac) only coderd's default equals
// Coder's value.
func TestAccessDiffers(t *testing.T) {
	shown := aggv1.CoderTemplateSpec{Access: fxAccess("use", map[string]aggv1.TemplateRole{"alice": "use", "bob": "admin"}, nil)}
	unknown := aggv1.CoderTemplateSpec{}
	for _, tc := range []struct {
		name      string
		next, cur *aggv1.CoderTemplateSpec
		want      bool
	}{
		{"unset", &aggv1.CoderTemplateSpec{}, &shown, false},
		{"same, other order", &aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{Everyone: "use", Users: []aggv1.TemplateAccessEntry{{Name: "bob", Role: "admin"}, {Name: "alice", Role: "use"}}}}, &shown, false},
		{"role changed", &aggv1.CoderTemplateSpec{Access: fxAccess("use", map[string]aggv1.TemplateRole{"alice": "admin", "bob": "admin"}, nil)}, &shown, true},
		{"entry dropped", &aggv1.CoderTemplateSpec{Access: fxAccess("use", map[string]aggv1.TemplateRole{"alice": "use"}, nil)}, &shown, true},
		{"everyone dropped", &aggv1.CoderTemplateSpec{Access: fxAccess("", map[string]aggv1.TemplateRole{"alice": "use", "bob": "admin"}, nil)}, &shown, true},
		{"coderd's default where it cannot tell", &aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{Everyone: "use"}}, &unknown, false},
		{"private where it cannot tell", &aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{}}, &unknown, true},
	} {
		if got := accessDiffers(tc.next, tc.cur); got != tc.want {
			t.Errorf("%s: differs = %v, want %v", tc.name, got, tc.want)
		}
	}

	// The refusal is the licensed settings' own.
	next := aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{Everyone: "use", Users: []aggv1.TemplateAccessEntry{{Name: "alice", Role: "use"}}}}
	errs := unlicensed(&next, &unknown, coderdFeatures{openSource: true})
	want := `spec.access: Forbidden: needs Coder's "template_rbac" feature, which this coderd does not have (open-source build)`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("refusal = %v, want %q", errs, want)
	}
	if errs := unlicensed(&aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{Everyone: "use"}}, &unknown, coderdFeatures{openSource: true}); len(errs) > 0 {
		t.Errorf("coderd's default refused on the open-source build: %v", errs)
	}
}

func TestValidateAccess(t *testing.T) {
	cur := aggv1.CoderTemplateSpec{}
	next := aggv1.CoderTemplateSpec{Access: &aggv1.TemplateAccess{
		Everyone: "read",
		Users:    []aggv1.TemplateAccessEntry{{Name: "alice", Role: "owner"}, {Name: "alice", Role: "use"}, {Role: "use"}},
		Groups:   []aggv1.TemplateAccessEntry{{Name: "Everyone", Role: "use"}},
	}}
	got := fxErrs(validateSettings(&next, &cur))
	want := []string{"FieldValueNotSupported spec.access.everyone", "FieldValueNotSupported spec.access.users[alice].role",
		"FieldValueDuplicate spec.access.users[alice]", "FieldValueRequired spec.access.users[2].name", "FieldValueInvalid spec.access.groups[Everyone]",
		// "" after "alice": not in name order.
		"FieldValueInvalid spec.access.users"}
	if !fxSameStrings(got, want) {
		t.Errorf("errors %q, want %q", got, want)
	}
	ok := aggv1.CoderTemplateSpec{Access: fxAccess("admin", map[string]aggv1.TemplateRole{"alice": "use"}, map[string]aggv1.TemplateRole{"devs": "admin"})}
	if errs := validateSettings(&ok, &cur); len(errs) > 0 {
		t.Errorf("a valid list refused: %v", errs)
	}
}

// The cost of showing access lists: the poller asks coderd for a
// template's list once per accessTTL, not once per poll; a get (fresh)
// asks every time, and what it read is what the next polls show.
func TestAccessListCost(t *testing.T) {
	ctx := context.Background()
	var aclGets atomic.Int32
	var expired atomic.Bool
	role := atomic.Value{}
	role.Store(codersdk.TemplateRoleUse)
	srv := sameIDsCoderd(t, "licensed", func(mux *http.ServeMux) {
		mux.HandleFunc("GET /api/v2/entitlements", func(w http.ResponseWriter, _ *http.Request) {
			_ = json.NewEncoder(w).Encode(codersdk.Entitlements{Features: map[codersdk.FeatureName]codersdk.Feature{
				codersdk.FeatureTemplateRBAC: {Entitlement: codersdk.EntitlementEntitled, Enabled: true}}})
		})
		mux.HandleFunc("GET /api/v2/templates/{id}/acl", func(w http.ResponseWriter, _ *http.Request) {
			aclGets.Add(1)
			if expired.Load() {
				// RequireFeatureMW once the license lacks template_rbac.
				w.WriteHeader(http.StatusForbidden)
				_ = json.NewEncoder(w).Encode(codersdk.Response{Message: "Template RBAC is a Premium feature. Contact sales!"})
				return
			}
			g := codersdk.TemplateGroup{Role: role.Load().(codersdk.TemplateRole)}
			g.ID, g.Name = fxTemplate().OrganizationID, everyoneGroup
			_ = json.NewEncoder(w).Encode(codersdk.TemplateACL{Users: []codersdk.TemplateUser{}, Groups: []codersdk.TemplateGroup{g}})
		})
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	backends := []backend.Backend{{Namespace: "coder", ControlPlane: "coder", URL: u, Client: coderapi.NewClient(u, "token", 10*time.Second, coderapi.Target{})}}
	ts, err := NewTemplates(Options{Backends: fxProvider{backends: backends}, PollInterval: time.Hour, Log: logr.Discard()}, TemplateOptions{Limits: templatesource.DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	tgt := targetsOf(backends)[0]
	everyone := func() aggv1.TemplateRole {
		t.Helper()
		objs, err := ts.listTemplates(ctx, tgt)
		if err != nil || len(objs) != 1 {
			t.Fatalf("list: %d templates, %v", len(objs), err)
		}
		a := objs[0].(*aggv1.CoderTemplate).Spec.Access
		if a == nil {
			t.Fatal("a licensed coderd's template shows no spec.access")
		}
		return a.Everyone
	}
	for range 3 {
		if got := everyone(); got != aggv1.TemplateRoleUse {
			t.Errorf("everyone %q, want use", got)
		}
	}
	if n := aclGets.Load(); n != 1 {
		t.Errorf("three polls asked for the access list %d times, want once", n)
	}
	// Changed in Coder: a get reads it, and the polls show it from then.
	role.Store(codersdk.TemplateRoleAdmin)
	var obj aggv1.CoderTemplate
	if err := ts.showAccess(ctx, tgt, &obj, fxTemplate(), true); err != nil {
		t.Fatal(err)
	}
	if got := everyone(); obj.Spec.Access.Everyone != aggv1.TemplateRoleAdmin || got != aggv1.TemplateRoleAdmin {
		t.Errorf("after the change, get shows %q and the poll %q; want admin", obj.Spec.Access.Everyone, got)
	}
	if n := aclGets.Load(); n != 2 {
		t.Errorf("asked for the access list %d times, want twice (the get's)", n)
	}
	// The license ends before the features are read again: a read shows
	// no list rather than failing.
	expired.Store(true)
	obj = aggv1.CoderTemplate{}
	if err := ts.showAccess(ctx, tgt, &obj, fxTemplate(), true); err != nil || obj.Spec.Access != nil {
		t.Errorf("with coderd's 403 Premium feature: access %+v, %v; want none, no error", obj.Spec.Access, err)
	}
}
