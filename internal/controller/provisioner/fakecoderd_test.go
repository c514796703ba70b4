package provisioner_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// fakeCoderd stands in for an Enterprise coderd entitled to external
// provisioner daemons, which the test stack cannot run (it builds the
// open-source coderd). It serves exactly the endpoints the reconciler
// uses, with the paths, methods, bodies and answers of coderd v2.30.0
// (codersdk types; enterprise/coderd/provisionerkeys.go): the session
// token header is required, request bodies are decoded strictly, and any
// other request gets coderd's 404 "Route not found." and fails the test,
// so a change of contract shows up.
type fakeCoderd struct {
	t     *testing.T
	token string
	srv   *httptest.Server
	URL   *url.URL

	mu   sync.Mutex
	orgs []codersdk.Organization
	// keys by organization ID, then key name.
	keys map[uuid.UUID]map[string]fakeKey
	// calls is every request as "METHOD path".
	calls      []string
	unexpected []string
}

type fakeKey struct {
	key    codersdk.ProvisionerKey
	secret string
}

func newFakeCoderd(t *testing.T, token string, orgNames ...string) *fakeCoderd {
	t.Helper()
	f := &fakeCoderd{t: t, token: token, keys: map[uuid.UUID]map[string]fakeKey{}}
	for i, name := range orgNames {
		f.orgs = append(f.orgs, codersdk.Organization{
			MinimalOrganization: codersdk.MinimalOrganization{ID: uuid.New(), Name: name, DisplayName: name},
			CreatedAt:           time.Now().UTC(), UpdatedAt: time.Now().UTC(), IsDefault: i == 0,
		})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v2/organizations/{organization}", f.getOrganization)
	mux.HandleFunc("GET /api/v2/organizations/{organization}/provisionerkeys", f.listKeys)
	mux.HandleFunc("POST /api/v2/organizations/{organization}/provisionerkeys", f.createKey)
	mux.HandleFunc("DELETE /api/v2/organizations/{organization}/provisionerkeys/{provisionerkey}", f.deleteKey)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.unexpected = append(f.unexpected, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		writeJSON(w, http.StatusNotFound, codersdk.Response{Message: "Route not found."})
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Header.Get(codersdk.SessionTokenHeader) != f.token {
			writeJSON(w, http.StatusUnauthorized, codersdk.Response{Message: "You must be logged in to use this endpoint."})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	f.URL, _ = url.Parse(f.srv.URL)
	t.Cleanup(func() {
		f.srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.unexpected) > 0 {
			t.Errorf("requests outside the coderd contract the fake serves: %v", f.unexpected)
		}
	})
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

var resourceNotFound = codersdk.Response{Message: "Resource not found or you do not have access to this resource"}

// org resolves {organization} by ID or name, as httpmw.ExtractOrganizationParam does.
func (f *fakeCoderd) org(param string) (codersdk.Organization, bool) {
	for _, o := range f.orgs {
		if o.ID.String() == param || o.Name == param {
			return o, true
		}
	}
	return codersdk.Organization{}, false
}

func (f *fakeCoderd) getOrganization(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.org(r.PathValue("organization"))
	if !ok {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (f *fakeCoderd) listKeys(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.org(r.PathValue("organization"))
	if !ok {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	out := []codersdk.ProvisionerKey{}
	for _, k := range f.keys[o.ID] {
		out = append(out, k.key)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	writeJSON(w, http.StatusOK, out)
}

func (f *fakeCoderd) createKey(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.org(r.PathValue("organization"))
	if !ok {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	var req codersdk.CreateProvisionerKeyRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON.", Detail: err.Error()})
		return
	}
	switch {
	case req.Name == "":
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Name is required"})
		return
	case len(req.Name) > 64:
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Name must be at most 64 characters"})
		return
	}
	if _, exists := f.keys[o.ID][req.Name]; exists {
		writeJSON(w, http.StatusConflict, codersdk.Response{
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
		secret: "pk-" + randomHex(16),
	}
	f.keys[o.ID][req.Name] = k
	writeJSON(w, http.StatusCreated, codersdk.CreateProvisionerKeyResponse{Key: k.secret})
}

func (f *fakeCoderd) deleteKey(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.org(r.PathValue("organization"))
	if !ok {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	name := r.PathValue("provisionerkey")
	if _, exists := f.keys[o.ID][name]; !exists {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
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

// count returns how many requests matched method and path exactly.
func (f *fakeCoderd) count(method, path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method+" "+path {
			n++
		}
	}
	return n
}
