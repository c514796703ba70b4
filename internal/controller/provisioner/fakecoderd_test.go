package provisioner_test

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// fakeCoderd stands in for an Enterprise coderd entitled to external
// provisioner daemons, which the test stack cannot run (it builds the
// open-source coderd). It serves exactly the endpoints the reconciler
// uses, with the paths, methods, bodies and answers of coderd v2.30.0
// (codersdk types; enterprise/coderd/provisionerkeys.go), on the shared
// plumbing (controllertest.FakeCoderd): the session token header is
// required, request bodies are decoded strictly, and any other request
// gets coderd's 404 "Route not found." and fails the test, so a change of
// contract shows up.
type fakeCoderd struct {
	*controllertest.FakeCoderd
	t *testing.T

	mu   sync.Mutex
	orgs []codersdk.Organization
	// keys by organization ID, then key name.
	keys map[uuid.UUID]map[string]fakeKey
}

type fakeKey struct {
	key    codersdk.ProvisionerKey
	secret string
}

func newFakeCoderd(t *testing.T, token string, orgNames ...string) *fakeCoderd {
	t.Helper()
	f := &fakeCoderd{t: t, keys: map[uuid.UUID]map[string]fakeKey{}}
	for i, name := range orgNames {
		f.orgs = append(f.orgs, codersdk.Organization{
			MinimalOrganization: codersdk.MinimalOrganization{ID: uuid.New(), Name: name, DisplayName: name},
			CreatedAt:           time.Now().UTC(), UpdatedAt: time.Now().UTC(), IsDefault: i == 0,
		})
	}
	f.FakeCoderd = controllertest.NewFakeCoderd(t, token, map[string]http.HandlerFunc{
		"GET /api/v2/organizations/{organization}":                                     f.inOrg(f.getOrganization),
		"GET /api/v2/organizations/{organization}/provisionerkeys":                     f.inOrg(f.listKeys),
		"POST /api/v2/organizations/{organization}/provisionerkeys":                    f.inOrg(f.createKey),
		"DELETE /api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}": f.inOrg(f.deleteKey),
	})
	return f
}

// org resolves {organization} by ID or name, as httpmw.ExtractOrganizationParam does.
func (f *fakeCoderd) org(param string) (codersdk.Organization, bool) {
	for _, o := range f.orgs {
		if o.ID.String() == param || o.Name == param {
			return o, true
		}
	}
	return codersdk.Organization{}, false
}

// inOrg resolves {organization} for h under the fake's lock, answering
// 404 as coderd does when there is no such organization.
func (f *fakeCoderd) inOrg(h func(http.ResponseWriter, *http.Request, codersdk.Organization)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		o, ok := f.org(r.PathValue("organization"))
		if !ok {
			controllertest.WriteJSON(w, http.StatusNotFound, controllertest.ResourceNotFound)
			return
		}
		h(w, r, o)
	}
}

func (f *fakeCoderd) getOrganization(w http.ResponseWriter, _ *http.Request, o codersdk.Organization) {
	controllertest.WriteJSON(w, http.StatusOK, o)
}

func (f *fakeCoderd) listKeys(w http.ResponseWriter, _ *http.Request, o codersdk.Organization) {
	out := []codersdk.ProvisionerKey{}
	for _, k := range f.keys[o.ID] {
		out = append(out, k.key)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	controllertest.WriteJSON(w, http.StatusOK, out)
}

func (f *fakeCoderd) createKey(w http.ResponseWriter, r *http.Request, o codersdk.Organization) {
	var req codersdk.CreateProvisionerKeyRequest
	if !controllertest.ReadJSON(w, r, &req, nil) {
		return
	}
	switch {
	case req.Name == "":
		controllertest.WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Name is required"})
		return
	case len(req.Name) > 64:
		controllertest.WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Name must be at most 64 characters"})
		return
	}
	if _, exists := f.keys[o.ID][req.Name]; exists {
		controllertest.WriteJSON(w, http.StatusConflict, codersdk.Response{
			Message: fmt.Sprintf("Provisioner key with name '%s' already exists in organization", req.Name)})
		return
	}
	if f.keys[o.ID] == nil {
		f.keys[o.ID] = map[string]fakeKey{}
	}
	k := fakeKey{
		key: codersdk.ProvisionerKey{
			ID: uuid.New(), CreatedAt: time.Now().UTC(), OrganizationID: o.ID,
			Name: req.Name, Tags: codersdk.ProvisionerKeyTags(req.Tags),
		},
		secret: "pk-" + controllertest.RandomHex(16),
	}
	f.keys[o.ID][req.Name] = k
	controllertest.WriteJSON(w, http.StatusCreated, codersdk.CreateProvisionerKeyResponse{Key: k.secret})
}

func (f *fakeCoderd) deleteKey(w http.ResponseWriter, r *http.Request, o codersdk.Organization) {
	name := r.PathValue("provisionerkey")
	if _, exists := f.keys[o.ID][name]; !exists {
		controllertest.WriteJSON(w, http.StatusNotFound, controllertest.ResourceNotFound)
		return
	}
	delete(f.keys[o.ID], name)
	w.WriteHeader(http.StatusNoContent)
}

// orgID returns the ID of the named organization.
func (f *fakeCoderd) orgID(name string) uuid.UUID {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.org(name)
	if !ok {
		f.t.Fatalf("fake coderd has no organization %q", name)
	}
	return o.ID
}

// keysIn returns the keys of an organization by name.
func (f *fakeCoderd) keysIn(org string) map[string]fakeKey {
	id := f.orgID(org)
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]fakeKey{}
	for n, k := range f.keys[id] {
		out[n] = k
	}
	return out
}
