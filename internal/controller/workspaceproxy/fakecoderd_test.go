package workspaceproxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// fakeCoderd stands in for an Enterprise coderd entitled to workspace
// proxies, which the test stack cannot run (it builds the open-source
// coderd). It serves exactly the endpoints the reconciler uses, with the
// paths, methods, bodies and answers of coderd v2.30.0 (codersdk types;
// enterprise/coderd/workspaceproxy.go): the session token header is
// required, request bodies are decoded strictly and validated as coderd
// does, and any other request gets coderd's 404 "Route not found." and
// fails the test, so a change of contract shows up.
type fakeCoderd struct {
	t     *testing.T
	token string
	srv   *httptest.Server
	URL   *url.URL

	mu      sync.Mutex
	primary codersdk.WorkspaceProxy
	proxies map[uuid.UUID]*fakeProxy
	// calls is every request as "METHOD path".
	calls      []string
	unexpected []string
}

type fakeProxy struct {
	proxy codersdk.WorkspaceProxy
	token string
}

func newFakeCoderd(t *testing.T, token string) *fakeCoderd {
	t.Helper()
	f := &fakeCoderd{t: t, token: token, proxies: map[uuid.UUID]*fakeProxy{}}
	f.primary = codersdk.WorkspaceProxy{
		Region: codersdk.Region{ID: uuid.New(), Name: "primary", DisplayName: "Default", IconURL: "/emojis/1f3e1.png", Healthy: true},
		Status: codersdk.WorkspaceProxyStatus{Status: codersdk.ProxyHealthy, CheckedAt: time.Now().UTC()},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v2/workspaceproxies", f.list)
	mux.HandleFunc("POST /api/v2/workspaceproxies", f.create)
	mux.HandleFunc("PATCH /api/v2/workspaceproxies/{workspaceproxy}", f.patch)
	mux.HandleFunc("DELETE /api/v2/workspaceproxies/{workspaceproxy}", f.delete)
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

// decode reads a request body strictly, as coderd's httpapi.Read does,
// and checks the fields codersdk marks validate:"required".
func decode(w http.ResponseWriter, r *http.Request, v any, required map[string]func() bool) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON.", Detail: err.Error()})
		return false
	}
	var missing []codersdk.ValidationError
	for field, present := range required {
		if !present() {
			missing = append(missing, codersdk.ValidationError{Field: field, Detail: "Validation failed for tag \"required\" with value: \"\""})
		}
	}
	if len(missing) > 0 {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Validation failed.", Validations: missing})
		return false
	}
	return true
}

func (f *fakeCoderd) list(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := codersdk.RegionsResponse[codersdk.WorkspaceProxy]{Regions: []codersdk.WorkspaceProxy{f.primary}}
	for _, p := range f.proxies {
		resp.Regions = append(resp.Regions, p.proxy)
	}
	writeJSON(w, http.StatusOK, resp)
}

func newProxyToken(id uuid.UUID) string { return id.String() + ":" + randomHex(16) }

func (f *fakeCoderd) create(w http.ResponseWriter, r *http.Request) {
	var req codersdk.CreateWorkspaceProxyRequest
	if !decode(w, r, &req, map[string]func() bool{"name": func() bool { return req.Name != "" }}) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.EqualFold(req.Name, "primary") {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: `The name "primary" is reserved for the primary region.`})
		return
	}
	for _, p := range f.proxies {
		if strings.EqualFold(p.proxy.Name, req.Name) {
			writeJSON(w, http.StatusConflict, codersdk.Response{Message: fmt.Sprintf("Workspace proxy with name %q already exists.", req.Name)})
			return
		}
	}
	id := uuid.New()
	now := time.Now().UTC()
	p := &fakeProxy{
		proxy: codersdk.WorkspaceProxy{
			Region:      codersdk.Region{ID: id, Name: req.Name, DisplayName: req.DisplayName, IconURL: req.Icon},
			DerpEnabled: true,
			Status:      codersdk.WorkspaceProxyStatus{Status: codersdk.ProxyUnregistered, CheckedAt: now},
			CreatedAt:   now, UpdatedAt: now,
		},
		token: newProxyToken(id),
	}
	f.proxies[id] = p
	writeJSON(w, http.StatusCreated, codersdk.UpdateWorkspaceProxyResponse{Proxy: p.proxy, ProxyToken: p.token})
}

// find resolves {workspaceproxy} by ID or name, as httpmw.ExtractWorkspaceProxyParam does.
func (f *fakeCoderd) find(param string) *fakeProxy {
	if id, err := uuid.Parse(param); err == nil {
		return f.proxies[id]
	}
	for _, p := range f.proxies {
		if strings.EqualFold(p.proxy.Name, param) {
			return p
		}
	}
	return nil
}

func (f *fakeCoderd) patch(w http.ResponseWriter, r *http.Request) {
	var req codersdk.PatchWorkspaceProxy
	if !decode(w, r, &req, map[string]func() bool{
		"id":           func() bool { return req.ID != uuid.Nil },
		"name":         func() bool { return req.Name != "" },
		"display_name": func() bool { return req.DisplayName != "" },
		"icon":         func() bool { return req.Icon != "" },
	}) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.find(r.PathValue("workspaceproxy"))
	if p == nil {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	p.proxy.Name, p.proxy.DisplayName, p.proxy.IconURL = req.Name, req.DisplayName, req.Icon
	p.proxy.UpdatedAt = time.Now().UTC()
	resp := codersdk.UpdateWorkspaceProxyResponse{Proxy: p.proxy}
	if req.RegenerateToken {
		p.token = newProxyToken(p.proxy.ID)
		resp.ProxyToken = p.token
	}
	writeJSON(w, http.StatusOK, resp)
}

func (f *fakeCoderd) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	param := r.PathValue("workspaceproxy")
	if param == f.primary.ID.String() || param == "primary" {
		writeJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Cannot delete primary proxy"})
		return
	}
	p := f.find(param)
	if p == nil {
		writeJSON(w, http.StatusNotFound, resourceNotFound)
		return
	}
	delete(f.proxies, p.proxy.ID)
	writeJSON(w, http.StatusOK, codersdk.Response{Message: "Proxy has been deleted!"})
}

// proxy returns the registered proxy of that name.
func (f *fakeCoderd) proxy(name string) (fakeProxy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.proxies {
		if p.proxy.Name == name {
			return *p, true
		}
	}
	return fakeProxy{}, false
}

func (f *fakeCoderd) registered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.proxies)
}

// callsExcept returns the requests other than those with the given method.
func (f *fakeCoderd) callsExcept(method string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if !strings.HasPrefix(c, method+" ") {
			out = append(out, c)
		}
	}
	return out
}

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
