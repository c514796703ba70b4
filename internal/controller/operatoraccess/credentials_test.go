package operatoraccess_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// secretValues are every value of every Secret in namespace ns: whatever
// the operator could send.
func (f *fixture) secretValues(t *testing.T, ns string, extra ...string) []string {
	t.Helper()
	var list corev1.SecretList
	if err := f.c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := append([]string(nil), extra...)
	for _, s := range list.Items {
		for k, v := range s.Data {
			if k != "email" && k != "username" && k != "url" && len(v) > 0 {
				out = append(out, string(v))
			}
		}
	}
	return out
}

func requireMismatch(t *testing.T, r operatoraccess.Result, err error, oldURL, newURL string, secrets []string) {
	t.Helper()
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if r.Ready || r.Reason != coderv1alpha1.ReasonCredentialsURLMismatch || r.TokenSecretRef != nil {
		t.Fatalf("result = %s: %s (ready %v, token %v); want not ready, %s, no token", r.Reason, r.Message, r.Ready, r.TokenSecretRef, coderv1alpha1.ReasonCredentialsURLMismatch)
	}
	if !strings.Contains(r.Message, oldURL) || !strings.Contains(r.Message, newURL) {
		t.Errorf("message %q does not name both URLs %s and %s", r.Message, oldURL, newURL)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(r.Message, s) {
			t.Errorf("message %q contains a credential", r.Message)
		}
	}
}

// TestCredentialsStayWithTheirCoderd changes the URL of control planes
// that hold access to a real coderd to a server the test runs (which
// forwards to the same coderd, so it answers like one): the operator
// sends no credential there and says new ones are needed, until the
// admin binds credentials to the new URL.
func TestCredentialsStayWithTheirCoderd(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	f := newFixture(t, k)
	ctx := context.Background()
	oldURL := coder.URL.String()

	t.Run("owner token", func(t *testing.T) {
		ccp := f.ownerTokenAccess(t, "ownertoken", coder, time.Hour)
		r, err := f.m.Reconcile(ctx, ccp, oldURL)
		mustReady(t, r, err)
		if got := f.secret(t, ccp.Namespace, "owner").Annotations[coderapi.AnnotationCoderURL]; got != oldURL {
			t.Errorf("owner token Secret bound to %q, want %q", got, oldURL)
		}
		if got := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name).Annotations[coderapi.AnnotationCoderURL]; got != oldURL {
			t.Errorf("operator token Secret bound to %q, want %q", got, oldURL)
		}

		rec := testenv.NewRecordingProxy(t, coder.URL)
		ccp.Spec.ExternalURL = rec.URL.String()
		r, err = f.m.Reconcile(ctx, ccp, rec.URL.String())
		secrets := f.secretValues(t, ccp.Namespace)
		requireMismatch(t, r, err, oldURL, rec.URL.String(), secrets)
		rec.RequireNoCredential(t, secrets)

		// The admin's way out: credentials bound to the new URL.
		owner := f.secret(t, ccp.Namespace, "owner")
		owner.Annotations[coderapi.AnnotationCoderURL] = rec.URL.String()
		if err := f.c.Update(ctx, owner); err != nil {
			t.Fatal(err)
		}
		r, err = f.m.Reconcile(ctx, ccp, rec.URL.String())
		mustReady(t, r, err)
		if got := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name).Annotations[coderapi.AnnotationCoderURL]; got != rec.URL.String() {
			t.Errorf("new operator token Secret bound to %q, want %q", got, rec.URL.String())
		}
	})

	t.Run("revocation after a URL change sends the token nowhere", func(t *testing.T) {
		ccp := f.ownerTokenAccess(t, "revoke", coder, time.Hour)
		r, err := f.m.Reconcile(ctx, ccp, oldURL)
		mustReady(t, r, err)
		tok := f.tokenClient(t, ccp, coder.URL, r)
		for len(f.rec.Events) > 0 {
			<-f.rec.Events
		}
		proxy := testenv.NewRecordingProxy(t, coder.URL)
		if err := f.m.Revoke(ctx, ccp, proxy.URL.String()); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		if n := len(proxy.Requests()); n != 0 {
			t.Errorf("the new URL received %d requests", n)
		}
		if f.secret(t, ccp.Namespace, r.TokenSecretRef.Name) != nil {
			t.Error("the token Secret is still there")
		}
		select {
		case ev := <-f.rec.Events:
			if !strings.Contains(ev, "OperatorTokenNotRevoked") || !strings.Contains(ev, oldURL) || !strings.Contains(ev, proxy.URL.String()) {
				t.Errorf("event %q does not say which token was left where", ev)
			}
		default:
			t.Error("no event says the token was not revoked")
		}
		// Not revoked: the admin has to, where it was issued.
		if _, err := tok.User(ctx, codersdk.Me); err != nil {
			t.Errorf("the token stopped working although it was sent nowhere: %v", err)
		}
	})

	t.Run("owner credentials, whose session is logged out after use", func(t *testing.T) {
		rec := testenv.NewRecordingProxy(t, coder.URL)
		ccp := f.ownerCredentialsAccess(t, "ownercreds", rec.URL.String(), coder.Email, coder.Password)
		r, err := f.m.Reconcile(ctx, ccp, rec.URL.String())
		mustReady(t, r, err)
		sessions := rec.SessionTokens()
		if len(sessions) != 1 {
			t.Fatalf("the operator opened %d sessions, want 1", len(sessions))
		}
		direct := coderapi.NewClient(coder.URL, sessions[0], 5*time.Second, coderapi.Target{})
		if _, err := direct.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			t.Errorf("the owner session the operator opened still works after use: %v", err)
		}
		if _, err := coder.Client.User(ctx, codersdk.Me); err != nil {
			t.Errorf("the user's own session was ended too: %v", err)
		}

		// Now the URL changes to another server.
		other := testenv.NewRecordingProxy(t, coder.URL)
		ccp.Spec.ExternalURL = other.URL.String()
		r, err = f.m.Reconcile(ctx, ccp, other.URL.String())
		secrets := f.secretValues(t, ccp.Namespace, coder.Password)
		requireMismatch(t, r, err, rec.URL.String(), other.URL.String(), secrets)
		other.RequireNoCredential(t, secrets)
		if !strings.Contains(r.Message, "Secret creds") || !strings.Contains(r.Message, coderapi.AnnotationCoderURL) {
			t.Errorf("message %q does not say which Secret and annotation to change", r.Message)
		}
	})
}

// TestFirstUserCredentialsStayWithTheirCoderd: the first user the operator
// created is used only with its coderd; its setup session ends and its
// setup password is replaced.
func TestFirstUserCredentialsStayWithTheirCoderd(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{SkipFirstUser: true})
	f := newFixture(t, k)
	ctx := context.Background()
	rec := testenv.NewRecordingProxy(t, coder.URL)
	ccp := f.controlPlane(t, "fresh", rec.URL.String(), coderv1alpha1.OperatorAccessSpec{})

	r, err := f.m.Reconcile(ctx, ccp, rec.URL.String())
	mustReady(t, r, err)
	admin := f.secret(t, ccp.Namespace, operatoraccess.AdminSecretName(ccp))

	t.Run("setup session logged out, setup password replaced", func(t *testing.T) {
		var setupPassword string
		for _, req := range rec.Requests() {
			if req.Method == http.MethodPost && req.Path == "/api/v2/users/first" {
				var first codersdk.CreateFirstUserRequest
				if err := json.Unmarshal(req.Body, &first); err != nil {
					t.Fatal(err)
				}
				setupPassword = first.Password
			}
		}
		if setupPassword == "" {
			t.Fatal("no first-user request seen")
		}
		sessions := rec.SessionTokens()
		if len(sessions) == 0 {
			t.Fatal("no login seen")
		}
		for _, s := range sessions {
			c := coderapi.NewClient(coder.URL, s, 5*time.Second, coderapi.Target{})
			if _, err := c.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
				t.Errorf("a session the operator opened as the first user still works: %v", err)
			}
		}
		anon := coderapi.NewClient(coder.URL, "", 5*time.Second, coderapi.Target{})
		if string(admin.Data["password"]) == setupPassword {
			t.Error("the Secret still holds the password used for setup")
		}
		if _, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: string(admin.Data["email"]), Password: setupPassword}); coderapi.StatusCode(err) != http.StatusUnauthorized {
			t.Errorf("the setup password still logs in: %v", err)
		}
		login, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: string(admin.Data["email"]), Password: string(admin.Data["password"])})
		if err != nil {
			t.Fatalf("the password in Secret %s does not log in: %v", admin.Name, err)
		}
		_ = coderapi.NewClient(coder.URL, login.SessionToken, 5*time.Second, coderapi.Target{}).Logout(ctx)
		if _, ok := admin.Data["password-next"]; ok {
			t.Error("the Secret still holds a pending password")
		}
		if admin.Annotations[coderapi.AnnotationCoderURL] != rec.URL.String() || string(admin.Data["url"]) != rec.URL.String() {
			t.Errorf("first user Secret bound to %q / %q, want %s", admin.Annotations[coderapi.AnnotationCoderURL], admin.Data["url"], rec.URL.String())
		}
	})

	t.Run("a new URL gets nothing", func(t *testing.T) {
		// The operator token must be reissued, which needs the first
		// user's credentials.
		tok := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
		if err := f.c.Delete(ctx, tok); err != nil {
			t.Fatal(err)
		}
		other := testenv.NewRecordingProxy(t, coder.URL)
		ccp.Spec.ExternalURL = other.URL.String()
		r, err := f.m.Reconcile(ctx, ccp, other.URL.String())
		secrets := f.secretValues(t, ccp.Namespace, string(tok.Data[coderapi.TokenKey]))
		requireMismatch(t, r, err, rec.URL.String(), other.URL.String(), secrets)
		other.RequireNoCredential(t, secrets)
		if !strings.Contains(r.Message, "ownerTokenSecretRef") || !strings.Contains(r.Message, "delete Secret "+admin.Name) {
			t.Errorf("message %q does not say what the admin can do", r.Message)
		}
	})

	t.Run("an interrupted rotation is completed at the next login", func(t *testing.T) {
		// As if the operator died after coderd took the new password
		// and before the Secret recorded it.
		admin := f.secret(t, ccp.Namespace, admin.Name)
		anon := coderapi.NewClient(coder.URL, "", 5*time.Second, coderapi.Target{})
		login, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: string(admin.Data["email"]), Password: string(admin.Data["password"])})
		if err != nil {
			t.Fatal(err)
		}
		next := "Ck8s-next-" + admin.ResourceVersion + "-password"
		session := coderapi.NewClient(coder.URL, login.SessionToken, 5*time.Second, coderapi.Target{})
		if err := session.UpdateUserPassword(ctx, codersdk.Me, codersdk.UpdateUserPasswordRequest{OldPassword: string(admin.Data["password"]), Password: next}); err != nil {
			t.Fatal(err)
		}
		admin.Data["password-next"] = []byte(next)
		if err := f.c.Update(ctx, admin); err != nil {
			t.Fatal(err)
		}
		ccp.Spec.ExternalURL = rec.URL.String()
		r, err := f.m.Reconcile(ctx, ccp, rec.URL.String())
		mustReady(t, r, err)
		admin = f.secret(t, ccp.Namespace, admin.Name)
		if string(admin.Data["password"]) != next {
			t.Errorf("the Secret's password is not the one coderd took")
		}
		if _, ok := admin.Data["password-next"]; ok {
			t.Error("the Secret still holds a pending password")
		}
	})
}
