package operatoraccess_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// licensedCoderd answers the requests Reconcile makes of a licensed
// (Enterprise) coderd, as codersdk v2.30.0 defines them; the open-source
// coderd of the test stack cannot take a license. Any other request gets
// coderd's 404 so contract drift fails the test.
type licensedCoderd struct {
	token    string
	license  string
	uploads  atomic.Int32
	operator uuid.UUID
}

func (l *licensedCoderd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	authed := r.Header.Get(codersdk.SessionTokenHeader) == l.token
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/v2/buildinfo":
		reply(http.StatusOK, codersdk.BuildInfoResponse{Version: "v2.30.0+enterprise"})
	case !authed:
		reply(http.StatusUnauthorized, codersdk.Response{Message: "You must be logged in to access this resource."})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v2/users/me":
		reply(http.StatusOK, codersdk.User{ReducedUser: codersdk.ReducedUser{
			MinimalUser: codersdk.MinimalUser{ID: l.operator, Username: operatoraccess.OperatorUsername},
		}, Roles: []codersdk.SlimRole{{Name: codersdk.RoleOwner}}})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v2/entitlements":
		reply(http.StatusOK, codersdk.Entitlements{
			HasLicense: l.uploads.Load() > 0,
			Features: map[codersdk.FeatureName]codersdk.Feature{
				codersdk.FeatureExternalProvisionerDaemons: {Entitlement: codersdk.EntitlementEntitled, Enabled: true},
				codersdk.FeatureWorkspaceProxy:             {Entitlement: codersdk.EntitlementNotEntitled},
			},
		})
	case r.Method == http.MethodPost && r.URL.Path == "/api/v2/licenses":
		var req codersdk.AddLicenseRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.License == "" {
			reply(http.StatusBadRequest, codersdk.Response{Message: "Invalid request body."})
			return
		}
		if req.License != l.license {
			reply(http.StatusBadRequest, codersdk.Response{Message: "Invalid license", Detail: "signature mismatch"})
			return
		}
		l.uploads.Add(1)
		reply(http.StatusCreated, codersdk.License{ID: l.uploads.Load(), UUID: uuid.New(), UploadedAt: time.Now()})
	default:
		reply(http.StatusNotFound, codersdk.Response{Message: "Route not found."})
	}
}

func TestLicenseUpload(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	f := newFixture(t, k)
	f.m.ValidateEvery = time.Nanosecond
	ctx := context.Background()
	fake := &licensedCoderd{token: "operator-token", license: "eyJhbGciOiJFZERTQSJ9.eyJ0cmlhbCI6ZmFsc2V9.c2ln", operator: uuid.New()}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)

	ccp := f.controlPlane(t, "licensed", srv.URL, coderv1alpha1.OperatorAccessSpec{})
	ccp.Spec.License = &coderv1alpha1.LicenseSpec{SecretRef: coderv1alpha1.SecretKeyReference{Name: "license", Key: "jwt"}}
	// The operator's token as an earlier pass would have stored it.
	for _, s := range []*corev1.Secret{{
		ObjectMeta: metav1.ObjectMeta{Name: coderapi.TokenSecretName(ccp.Name), Namespace: ccp.Namespace, Annotations: map[string]string{
			"coder.com/coder-url":              srv.URL,
			"coder.com/token-id":               "tokenid",
			"coder.com/token-expires-at":       time.Now().Add(100 * time.Hour).UTC().Format(time.RFC3339),
			"coder.com/token-lifetime-seconds": "604800",
			"coder.com/token-name":             "k8s-test",
		}},
		Data: map[string][]byte{coderapi.TokenKey: []byte(fake.token)},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "license", Namespace: ccp.Namespace},
		Data:       map[string][]byte{"jwt": []byte(fake.license)},
	}} {
		if err := f.c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	r, err := f.m.Reconcile(ctx, ccp, srv.URL)
	mustReady(t, r, err)
	if r.License == nil || !r.License.Applied {
		t.Fatalf("license result = %+v, want applied", r.License)
	}
	if fake.uploads.Load() != 1 {
		t.Errorf("uploads = %d, want 1", fake.uploads.Load())
	}
	if r.Entitlements == nil || !r.Entitlements.HasLicense || len(r.Entitlements.Features) != 1 ||
		r.Entitlements.Features[0] != string(codersdk.FeatureExternalProvisionerDaemons) {
		t.Errorf("entitlements = %+v, want a license with only the entitled, enabled feature", r.Entitlements)
	}

	t.Run("the same license is not uploaded again", func(t *testing.T) {
		r, err := f.m.Reconcile(ctx, ccp, srv.URL)
		mustReady(t, r, err)
		if fake.uploads.Load() != 1 || r.License == nil || !r.License.Applied {
			t.Errorf("uploads = %d, license = %+v", fake.uploads.Load(), r.License)
		}
	})

	t.Run("a rejected license is reported with Coder's message", func(t *testing.T) {
		var s corev1.Secret
		if err := f.c.Get(ctx, clientKey(ccp.Namespace, "license"), &s); err != nil {
			t.Fatal(err)
		}
		s.Data["jwt"] = bytes.ToUpper(s.Data["jwt"])
		if err := f.c.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
		r, err := f.m.Reconcile(ctx, ccp, srv.URL)
		mustReady(t, r, err)
		if r.License == nil || r.License.Applied || r.License.Reason != "Rejected" || !bytes.Contains([]byte(r.License.Message), []byte("signature mismatch")) {
			t.Errorf("license result = %+v", r.License)
		}
	})
}
