package coderapi

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// TestOperationOfCodersdkRequests has the real codersdk client send its
// requests (to a server that records their method and path and answers
// 404) and checks the operations they map to: IDs and names become {id},
// route words stay.
func TestOperationOfCodersdkRequests(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, Operation(r.Method, r.URL.Path))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"message":"not found"}`))
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	c := codersdk.New(u)
	ctx := context.Background()
	id := uuid.New()

	cases := []struct {
		call func() error
		want string
	}{
		{func() error { _, err := c.BuildInfo(ctx); return err }, "GET /api/v2/buildinfo"},
		{func() error { _, err := c.User(ctx, codersdk.Me); return err }, "GET /api/v2/users/me"},
		{func() error { _, err := c.User(ctx, "alice"); return err }, "GET /api/v2/users/{id}"},
		{func() error { _, err := c.HasFirstUser(ctx); return err }, "GET /api/v2/users/first"},
		{func() error {
			_, err := c.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: "a@b.c", Password: "p"})
			return err
		}, "POST /api/v2/users/login"},
		{func() error { _, err := c.CreateToken(ctx, codersdk.Me, codersdk.CreateTokenRequest{}); return err }, "POST /api/v2/users/me/keys/tokens"},
		{func() error { return c.DeleteAPIKey(ctx, codersdk.Me, "abc123") }, "DELETE /api/v2/users/me/keys/{id}"},
		{func() error { _, err := c.Workspaces(ctx, codersdk.WorkspaceFilter{Owner: "alice"}); return err }, "GET /api/v2/workspaces"},
		{func() error { _, err := c.Workspace(ctx, id); return err }, "GET /api/v2/workspaces/{id}"},
		{func() error {
			_, err := c.WorkspaceByOwnerAndName(ctx, "alice", "dev", codersdk.WorkspaceOptions{})
			return err
		}, "GET /api/v2/users/{id}/workspace/{id}"},
		{func() error {
			_, err := c.CreateWorkspaceBuild(ctx, id, codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionStop})
			return err
		}, "POST /api/v2/workspaces/{id}/builds"},
		{func() error {
			_, err := c.CreateUserWorkspace(ctx, "alice", codersdk.CreateWorkspaceRequest{})
			return err
		}, "POST /api/v2/users/{id}/workspaces"},
		{func() error { _, err := c.TemplatesByOrganization(ctx, id); return err }, "GET /api/v2/organizations/{id}/templates"},
		{func() error { _, err := c.TemplateByName(ctx, id, "demo"); return err }, "GET /api/v2/organizations/{id}/templates/{id}"},
		{func() error { _, err := c.Template(ctx, id); return err }, "GET /api/v2/templates/{id}"},
		{func() error {
			return c.UpdateActiveTemplateVersion(ctx, id, codersdk.UpdateActiveTemplateVersion{ID: id})
		}, "PATCH /api/v2/templates/{id}/versions"},
		{func() error { return c.DeleteTemplate(ctx, id) }, "DELETE /api/v2/templates/{id}"},
		{func() error { _, err := c.TemplateVersion(ctx, id); return err }, "GET /api/v2/templateversions/{id}"},
		{func() error {
			_, err := c.CreateTemplateVersion(ctx, id, codersdk.CreateTemplateVersionRequest{})
			return err
		}, "POST /api/v2/organizations/{id}/templateversions"},
		{func() error {
			_, err := c.Upload(ctx, codersdk.ContentTypeTar, strings.NewReader("x"))
			return err
		}, "POST /api/v2/files"},
		{func() error { _, err := c.ListProvisionerKeys(ctx, id); return err }, "GET /api/v2/organizations/{id}/provisionerkeys"},
		{func() error { _, err := c.Entitlements(ctx); return err }, "GET /api/v2/entitlements"},
		// A name that is also a route word stays: the operation is still
		// one of a bounded set.
		{func() error {
			_, err := c.WorkspaceByOwnerAndName(ctx, "alice", "logs", codersdk.WorkspaceOptions{})
			return err
		}, "GET /api/v2/users/{id}/workspace/logs"},
	}
	for _, tc := range cases {
		mu.Lock()
		seen = nil
		mu.Unlock()
		if err := tc.call(); err == nil {
			t.Errorf("%s: no error from a 404", tc.want)
		}
		mu.Lock()
		got := seen
		mu.Unlock()
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("requests %q, want one %q", got, tc.want)
		}
	}
}

func TestOperationEdgeCases(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"get", "/api/v2/buildinfo", "GET /api/v2/buildinfo"},
		{"BREW", "/api/v2/buildinfo", "OTHER /api/v2/buildinfo"},
		{"GET", "", "GET /"},
		{"GET", "/", "GET /"},
		{"GET", "/api/v2/users//keys", "GET /api/v2/users/{id}/keys"},
		{"GET", "/API/V2/USERS", "GET /{id}/{id}/{id}"},
		{"GET", "/a/b/c/d/e/f/g/h/i/j/k/l/m", "GET /{id}/{id}/{id}/{id}/{id}/{id}/{id}/{id}/{id}/{id}/..."},
	} {
		if got := Operation(tc.method, tc.path); got != tc.want {
			t.Errorf("Operation(%q, %q) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestOperationIsBounded: whatever the path, every segment of an
// operation is a route word, the placeholder or the cut marker, and there
// are at most maxRouteSegments+1 of them.
func TestOperationIsBounded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	words := make([]string, 0, len(routeWords))
	for w := range routeWords {
		words = append(words, w)
	}
	for range 2000 {
		var segs []string
		for range r.IntN(15) {
			if r.IntN(2) == 0 {
				segs = append(segs, words[r.IntN(len(words))])
			} else {
				segs = append(segs, uuid.NewString()[:r.IntN(36)])
			}
		}
		path := "/" + strings.Join(segs, "/")
		op := Operation(http.MethodGet, path)
		_, route, _ := strings.Cut(op, " ")
		parts := strings.Split(strings.TrimPrefix(route, "/"), "/")
		if len(parts) > maxRouteSegments+1 {
			t.Fatalf("Operation(%q) = %q: %d segments", path, op, len(parts))
		}
		for _, p := range parts {
			if !routeWords[p] && p != placeholder && p != "..." && route != "/" {
				t.Fatalf("Operation(%q) = %q keeps %q", path, op, p)
			}
		}
	}
}
