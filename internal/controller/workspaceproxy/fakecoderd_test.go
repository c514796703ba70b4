package workspaceproxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/controller/controllertest"
)

// fakeCoderd stands in for an Enterprise coderd entitled to workspace
// proxies, which the test stack cannot run (it builds the open-source
// coderd). It serves exactly the endpoints the reconciler uses, with the
// paths, methods, bodies and answers of coderd v2.30.0 (codersdk types;
// enterprise/coderd/workspaceproxy.go), on the shared plumbing
// (controllertest.FakeCoderd): the session token header is required,
// request bodies are decoded strictly and validated as coderd does, and
// any other request gets coderd's 404 "Route not found." and fails the
// test, so a change of contract shows up.
type fakeCoderd struct {
	*controllertest.FakeCoderd

	mu      sync.Mutex
	primary codersdk.WorkspaceProxy
	proxies map[uuid.UUID]*fakeProxy
}

type fakeProxy struct {
	proxy codersdk.WorkspaceProxy
	token string
}

func newFakeCoderd(t *testing.T, token string) *fakeCoderd {
	t.Helper()
	f := &fakeCoderd{proxies: map[uuid.UUID]*fakeProxy{}}
	f.primary = codersdk.WorkspaceProxy{
		Region: codersdk.Region{ID: uuid.New(), Name: "primary", DisplayName: "Default", IconURL: "/emojis/1f3e1.png", Healthy: true},
		Status: codersdk.WorkspaceProxyStatus{Status: codersdk.ProxyHealthy, CheckedAt: time.Now().UTC()},
	}
	f.FakeCoderd = controllertest.NewFakeCoderd(t, token, map[string]http.HandlerFunc{
		"GET /api/v2/workspaceproxies":                     f.list,
		"POST /api/v2/workspaceproxies":                    f.create,
		"PATCH /api/v2/workspaceproxies/{workspaceproxy}":  f.patch,
		"DELETE /api/v2/workspaceproxies/{workspaceproxy}": f.delete,
	})
	return f
}

func (f *fakeCoderd) list(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := codersdk.RegionsResponse[codersdk.WorkspaceProxy]{Regions: []codersdk.WorkspaceProxy{f.primary}}
	for _, p := range f.proxies {
		resp.Regions = append(resp.Regions, p.proxy)
	}
	controllertest.WriteJSON(w, http.StatusOK, resp)
}

func newProxyToken(id uuid.UUID) string { return id.String() + ":" + controllertest.RandomHex(16) }

func (f *fakeCoderd) create(w http.ResponseWriter, r *http.Request) {
	var req codersdk.CreateWorkspaceProxyRequest
	if !controllertest.ReadJSON(w, r, &req, map[string]func() bool{"name": func() bool { return req.Name != "" }}) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.EqualFold(req.Name, "primary") {
		controllertest.WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: `The name "primary" is reserved for the primary region.`})
		return
	}
	for _, p := range f.proxies {
		if strings.EqualFold(p.proxy.Name, req.Name) {
			controllertest.WriteJSON(w, http.StatusConflict, codersdk.Response{Message: fmt.Sprintf("Workspace proxy with name %q already exists.", req.Name)})
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
	controllertest.WriteJSON(w, http.StatusCreated, codersdk.UpdateWorkspaceProxyResponse{Proxy: p.proxy, ProxyToken: p.token})
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
	if !controllertest.ReadJSON(w, r, &req, map[string]func() bool{
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
		controllertest.WriteJSON(w, http.StatusNotFound, controllertest.ResourceNotFound)
		return
	}
	p.proxy.Name, p.proxy.DisplayName, p.proxy.IconURL = req.Name, req.DisplayName, req.Icon
	p.proxy.UpdatedAt = time.Now().UTC()
	resp := codersdk.UpdateWorkspaceProxyResponse{Proxy: p.proxy}
	if req.RegenerateToken {
		p.token = newProxyToken(p.proxy.ID)
		resp.ProxyToken = p.token
	}
	controllertest.WriteJSON(w, http.StatusOK, resp)
}

func (f *fakeCoderd) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	param := r.PathValue("workspaceproxy")
	if param == f.primary.ID.String() || param == "primary" {
		controllertest.WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Cannot delete primary proxy"})
		return
	}
	p := f.find(param)
	if p == nil {
		controllertest.WriteJSON(w, http.StatusNotFound, controllertest.ResourceNotFound)
		return
	}
	delete(f.proxies, p.proxy.ID)
	controllertest.WriteJSON(w, http.StatusOK, codersdk.Response{Message: "Proxy has been deleted!"})
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
