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
