package coderapi_test

import (
	"encoding/json"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestFeatureUnavailableOnOpenSourceCoderd asks the real open-source
// coderd for the Enterprise features the operator uses and checks how its
// answers are classified: every one is "not supported" with Coder's
// message, while a missing item on a route the open-source build has is
// not mistaken for a missing feature.
func TestFeatureUnavailableOnOpenSourceCoderd(t *testing.T) {
	c := testenv.NewCoder(t, testenv.CoderOptions{})
	ctx := t.Context()
	cl := coderapi.NewClient(c.URL, c.SessionToken, 0, coderapi.Target{})

	calls := map[string]func() error{
		"ListProvisionerKeys": func() error {
			_, err := cl.ListProvisionerKeys(ctx, c.OrganizationID)
			return err
		},
		"CreateProvisionerKey": func() error {
			_, err := cl.CreateProvisionerKey(ctx, c.OrganizationID, codersdk.CreateProvisionerKeyRequest{Name: "k", Tags: map[string]string{}})
			return err
		},
		"DeleteProvisionerKey": func() error { return cl.DeleteProvisionerKey(ctx, c.OrganizationID, "k") },
		"WorkspaceProxies": func() error {
			_, err := cl.WorkspaceProxies(ctx)
			return err
		},
		"CreateWorkspaceProxy": func() error {
			_, err := cl.CreateWorkspaceProxy(ctx, codersdk.CreateWorkspaceProxyRequest{Name: "p"})
			return err
		},
		"PatchWorkspaceProxy": func() error {
			_, err := cl.PatchWorkspaceProxy(ctx, codersdk.PatchWorkspaceProxy{ID: uuid.New(), Name: "p", DisplayName: "p", Icon: "/i.png"})
			return err
		},
		"DeleteWorkspaceProxyByName": func() error { return cl.DeleteWorkspaceProxyByName(ctx, "p") },
		"Groups": func() error {
			_, err := cl.Groups(ctx, codersdk.GroupArguments{Organization: c.OrganizationID.String()})
			return err
		},
		"CreateGroup": func() error {
			_, err := cl.CreateGroup(ctx, c.OrganizationID, codersdk.CreateGroupRequest{Name: "g"})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		reason, ok := coderapi.FeatureUnavailable(err)
		if !ok || reason != coderv1alpha1.ReasonNotSupported {
			t.Errorf("%s: FeatureUnavailable(%v) = %q, %v; want %s", name, err, reason, ok, coderv1alpha1.ReasonNotSupported)
			continue
		}
		if code, msg := coderapi.StatusCode(err), coderapi.Message(err); code != http.StatusNotFound || msg != "Route not found." {
			t.Errorf("%s: coderd answered %d %q, want 404 \"Route not found.\"", name, code, msg)
		}
	}
	// Organization writes: the open-source router has the paths (GET
	// only), so chi answers 405 with no body.
	orgWrites := map[string]func() error{
		"CreateOrganization": func() error {
			_, err := cl.CreateOrganization(ctx, codersdk.CreateOrganizationRequest{Name: "other"})
			return err
		},
		"UpdateOrganization": func() error {
			_, err := cl.UpdateOrganization(ctx, c.OrganizationID.String(), codersdk.UpdateOrganizationRequest{DisplayName: "x"})
			return err
		},
		"DeleteOrganization": func() error { return cl.DeleteOrganization(ctx, c.OrganizationID.String()) },
	}
	for name, call := range orgWrites {
		err := call()
		reason, ok := coderapi.FeatureUnavailable(err)
		if !ok || reason != coderv1alpha1.ReasonNotSupported {
			t.Errorf("%s: FeatureUnavailable(%v) = %q, %v; want %s", name, err, reason, ok, coderv1alpha1.ReasonNotSupported)
		}
		if code := coderapi.StatusCode(err); code != http.StatusMethodNotAllowed {
			t.Errorf("%s: coderd answered %d, want 405", name, code)
		}
	}

	// A route the open-source build has, for an item that does not exist.
	_, err := cl.OrganizationByName(ctx, "no-such-organization")
	if !coderapi.IsNotFound(err) {
		t.Fatalf("OrganizationByName(missing) = %v, want a 404", err)
	}
	if coderapi.IsFeatureUnavailable(err) {
		t.Errorf("a missing organization (%q) is classified as a missing feature", coderapi.Message(err))
	}
	// A working call is no error at all.
	if _, err := cl.OrganizationByName(ctx, "coder"); err != nil || coderapi.IsFeatureUnavailable(err) {
		t.Errorf("OrganizationByName(coder) = %v", err)
	}
}

// TestFeatureUnavailableNotEntitled classifies the answers of an
// Enterprise coderd whose license lacks the feature. The test stack runs
// the open-source coderd only, so these are the exact bodies coderd
// v2.30.0 writes (enterprise/coderd RequireFeatureMW and
// provisionerDaemonsEnabledMW), served over HTTP and read through codersdk.
func TestFeatureUnavailableNotEntitled(t *testing.T) {
	answers := map[string]struct {
		status      int
		message     string
		unavailable bool
		reason      string
	}{
		"/api/v2/workspaceproxies":                                        {http.StatusForbidden, "Workspace Proxy is a Premium feature. Contact sales!", true, coderv1alpha1.ReasonNotEntitled},
		"/api/v2/organizations/" + uuid.Nil.String() + "/provisionerkeys": {http.StatusForbidden, "External Provisioner Daemons is a Premium feature. Contact sales!", true, coderv1alpha1.ReasonNotEntitled},
		"/api/v2/users/me":                                                {http.StatusForbidden, "Forbidden.", false, ""},
		"/api/v2/templates":                                               {http.StatusInternalServerError, "Internal error.", false, ""},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := answers[r.URL.Path]
		if !ok {
			a.status, a.message = http.StatusNotFound, "Route not found."
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_ = json.NewEncoder(w).Encode(codersdk.Response{Message: a.message})
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	cl := coderapi.NewClient(u, "token", 0, coderapi.Target{})
	for path, a := range answers {
		res, err := cl.Request(t.Context(), http.MethodGet, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		apiErr := codersdk.ReadBodyAsError(res)
		_ = res.Body.Close()
		reason, ok := coderapi.FeatureUnavailable(apiErr)
		if ok != a.unavailable || reason != a.reason {
			t.Errorf("%d %q: FeatureUnavailable = %q, %v; want %q, %v", a.status, a.message, reason, ok, a.reason, a.unavailable)
		}
		if coderapi.Message(apiErr) != a.message {
			t.Errorf("Message = %q, want Coder's %q", coderapi.Message(apiErr), a.message)
		}
	}
	if coderapi.IsFeatureUnavailable(nil) {
		t.Errorf("IsFeatureUnavailable(nil) = true")
	}
}

// TestFeatureUnavailableMethodNotAllowed: the open-source coderd routes
// only GET on /api/v2/organizations and /api/v2/organizations/{org}, so
// an organization create, rename or delete gets chi's 405 with an empty
// body (asked of the real coderd in
// TestFeatureUnavailableOnOpenSourceCoderd's organization calls). That is
// "not supported"; a 405 with a message (not coderd's) is not.
func TestFeatureUnavailableMethodNotAllowed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/empty":
			w.WriteHeader(http.StatusMethodNotAllowed)
		case "/empty-json":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_ = json.NewEncoder(w).Encode(codersdk.Response{Message: "Method not allowed by the proxy."})
		}
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	cl := coderapi.NewClient(u, "token", 0, coderapi.Target{})
	for path, want := range map[string]bool{"/empty": true, "/empty-json": true, "/message": false} {
		res, err := cl.Request(t.Context(), http.MethodPost, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		apiErr := codersdk.ReadBodyAsError(res)
		_ = res.Body.Close()
		reason, ok := coderapi.FeatureUnavailable(apiErr)
		if ok != want || (ok && reason != coderv1alpha1.ReasonNotSupported) {
			t.Errorf("405 at %s (%v): FeatureUnavailable = %q, %v; want %v", path, apiErr, reason, ok, want)
		}
	}
}
