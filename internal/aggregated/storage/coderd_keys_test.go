package storage

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// sameIDsCoderd answers like coderd v2.30 for one template and one
// workspace, always with the fixture IDs: what a tenant's coderd, which
// answers whatever it likes, can claim. who marks everything it serves.
// Real coderds never share IDs, so this is the one fake the test needs.
// extra adds routes (an enterprise coderd's).
func sameIDsCoderd(t *testing.T, who string, extra ...func(*http.ServeMux)) *httptest.Server {
	t.Helper()
	archive, err := templatesource.Archive(map[string]string{"main.tf": "# " + who + "\n"}, templatesource.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	fileID := uuid.MustParse("66666666-6666-4666-8666-666666666666")
	tpl := fxTemplate()
	tpl.Description = "template of " + who
	ws := fxWorkspace()
	presetID := uuid.MustParse("77777777-7777-4777-8777-777777777777")
	ws.LatestBuild.TemplateVersionPresetID = &presetID
	mux := http.NewServeMux()
	writeJSON := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /api/v2/templates", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, []codersdk.Template{*tpl})
	})
	mux.HandleFunc("GET /api/v2/templateversions/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fxVersionID.String() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, codersdk.TemplateVersion{ID: fxVersionID, TemplateID: &tpl.ID, Name: "version-of-" + who,
			Job: codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobSucceeded, FileID: fileID}})
	})
	mux.HandleFunc("GET /api/v2/templateversions/{id}/variables", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fxVersionID.String() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, []codersdk.TemplateVersionVariable{{Name: "owner", Type: "string", Value: who, DefaultValue: "nobody"}})
	})
	mux.HandleFunc("GET /api/v2/templateversions/{id}/rich-parameters", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fxVersionID.String() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, []codersdk.TemplateVersionParameter{{Name: "owner", Type: "string", Mutable: true}})
	})
	mux.HandleFunc("GET /api/v2/templateversions/{id}/presets", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fxVersionID.String() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, []codersdk.Preset{{ID: presetID, Name: "preset-of-" + who}})
	})
	mux.HandleFunc("GET /api/v2/files/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fileID.String() {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", codersdk.ContentTypeTar)
		_, _ = w.Write(archive)
	})
	mux.HandleFunc("GET /api/v2/workspaces", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, codersdk.WorkspacesResponse{Workspaces: []codersdk.Workspace{*ws}, Count: 1})
	})
	mux.HandleFunc("GET /api/v2/workspacebuilds/{id}/parameters", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != fxBuildID.String() {
			http.NotFound(w, r)
			return
		}
		writeJSON(w, []codersdk.WorkspaceBuildParameter{{Name: "owner", Value: who}})
	})
	mux.HandleFunc("GET /api/v2/organizations/{org}", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, codersdk.Organization{MinimalOrganization: codersdk.MinimalOrganization{ID: uuid.New(), Name: "acme"}})
	})
	for _, add := range extra {
		add(mux)
	}
	// What else it is asked (GET /api/v2/entitlements) it answers as the
	// open-source coderd answers a route it does not have.
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(codersdk.Response{Message: "Route not found."})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestCachesAreKeyedPerCoderd serves two namespaces from two coderds that
// use the same template, version, file and build IDs, through one
// storage: each namespace sees only what its own coderd answered, in
// either order, however often it is read.
func TestCachesAreKeyedPerCoderd(t *testing.T) {
	ctx := context.Background()
	var backends []backend.Backend
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		u, err := url.Parse(sameIDsCoderd(t, ns).URL)
		if err != nil {
			t.Fatal(err)
		}
		backends = append(backends, backend.Backend{Namespace: ns, ControlPlane: "coder", URL: u,
			Client: coderapi.NewClient(u, "token-of-"+ns, 10*time.Second, coderapi.Target{})})
	}
	o := Options{Backends: fxProvider{backends: backends}, PollInterval: time.Hour, Log: logr.Discard()}
	ws, err := NewWorkspaces(o)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := NewTemplates(o, TemplateOptions{Limits: templatesource.DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	targets := targetsOf(backends)
	for round := range 2 {
		for _, i := range []int{0, 1, 1, 0} {
			tgt := targets[i]
			who := tgt.Namespace

			tpls, err := ts.listTemplates(ctx, tgt)
			if err != nil {
				t.Fatalf("round %d: list templates of %s: %v", round, who, err)
			}
			if len(tpls) != 1 {
				t.Fatalf("round %d: %s has %d templates, want 1", round, who, len(tpls))
			}
			tpl := tpls[0].(*aggv1.CoderTemplate)
			if tpl.Spec.Description != "template of "+who || tpl.Status.ActiveVersionName != "version-of-"+who || tpl.Spec.Files["main.tf"] != "# "+who+"\n" {
				t.Errorf("round %d: %s's template shows description %q, version %q and files %q: not all its own coderd's",
					round, who, tpl.Spec.Description, tpl.Status.ActiveVersionName, tpl.Spec.Files)
			}

			if v := tpl.Spec.Variables; len(v) != 1 || v[0].Name != "owner" || v[0].Value != who {
				t.Errorf("round %d: %s's template shows variables %+v, want owner=%s from its own coderd", round, who, v, who)
			}

			got, err := ws.listWorkspaces(ctx, tgt)
			if err != nil {
				t.Fatalf("round %d: list workspaces of %s: %v", round, who, err)
			}
			if len(got) != 1 {
				t.Fatalf("round %d: %s has %d workspaces, want 1", round, who, len(got))
			}
			// The list hands the cache each object with its fingerprint.
			w := watchcache.Unwrap(got[0]).(*aggv1.CoderWorkspace)
			if p := w.Spec.Parameters; len(p) != 1 || p[0].Value != who {
				t.Errorf("round %d: %s's workspace shows parameters %v, want owner=%s from its own coderd", round, who, p, who)
			}
			if w.Spec.Preset != "preset-of-"+who {
				t.Errorf("round %d: %s's workspace shows preset %q, want its own coderd's", round, who, w.Spec.Preset)
			}

			if _, err := ts.orgs.get(ctx, tgt, "acme"); err != nil {
				t.Fatalf("organization of %s: %v", who, err)
			}
		}
	}
	// One entry per coderd in each cache: nothing read from one coderd
	// answered for the other.
	if n := len(ts.versions.facts); n != 2 {
		t.Errorf("version cache holds %d entries, want one per coderd", n)
	}
	if n := len(ts.vars.facts); n != 2 {
		t.Errorf("version variables cache holds %d entries, want one per coderd", n)
	}
	if n := len(ws.params.facts); n != 2 {
		t.Errorf("build parameter cache holds %d entries, want one per coderd", n)
	}
	if n := len(ws.versions.facts); n != 2 {
		t.Errorf("version parameter cache holds %d entries, want one per coderd", n)
	}
	if n := len(ts.orgs.facts); n != 2 {
		t.Errorf("organization cache holds %d entries, want one per coderd", n)
	}
}
