package operatoraccess_test

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

type fixture struct {
	k   *testenv.KubeAPI
	c   client.Client
	rec *events.FakeRecorder
	m   *operatoraccess.Manager
}

func newFixture(t *testing.T, k *testenv.KubeAPI) *fixture {
	t.Helper()
	c, err := client.New(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	rec := events.NewFakeRecorder(100)
	return &fixture{k: k, c: c, rec: rec, m: &operatoraccess.Manager{Client: c, Recorder: rec, Timeout: 5 * time.Second, RevokeReplacedAfter: testRevokeDelay}}
}

// testRevokeDelay is the fixture's grace period of a replaced token.
const testRevokeDelay = 2 * time.Second

// revokedAfterDelay checks a rotation's grace period (rotated is the
// result of the pass that rotated): the replaced token (old) still works
// once its successor is stored, that pass asks to come back no later than
// the delay, and the first pass after the delay revokes it and clears the
// record from the token Secret.
func (f *fixture) revokedAfterDelay(t *testing.T, ccp *coderv1alpha1.CoderControlPlane, coderURL string, rotated operatoraccess.Result, old *codersdk.Client) {
	t.Helper()
	ctx := context.Background()
	if _, err := old.User(ctx, codersdk.Me); err != nil {
		t.Fatalf("the replaced token stopped working before its grace period ended: %v", err)
	}
	if rotated.RequeueAfter <= 0 || rotated.RequeueAfter > testRevokeDelay+time.Second {
		t.Errorf("the rotating pass requeues after %s, want at most the revocation delay %s (rounded up to the second)", rotated.RequeueAfter, testRevokeDelay)
	}
	s := f.secret(t, ccp.Namespace, rotated.TokenSecretRef.Name)
	after, err := time.Parse(time.RFC3339, s.Annotations["coder.com/revoke-replaced-after"])
	if err != nil || s.Annotations["coder.com/replaced-token-ids"] == "" {
		t.Fatalf("the token Secret records no pending revocation: %v", s.Annotations)
	}
	time.Sleep(time.Until(after))
	r, err := f.m.Reconcile(ctx, ccp, coderURL)
	mustReady(t, r, err)
	if _, err := old.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
		t.Errorf("the replaced token still works after the revocation delay: %v", err)
	}
	s = f.secret(t, ccp.Namespace, rotated.TokenSecretRef.Name)
	if v, ok := s.Annotations["coder.com/replaced-token-ids"]; ok {
		t.Errorf("the token Secret still records replaced tokens %q after revoking them", v)
	}
}

// controlPlane creates a CoderControlPlane adopting coderd at url in a new
// namespace.
func (f *fixture) controlPlane(t *testing.T, name, coderURL string, access coderv1alpha1.OperatorAccessSpec) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "access-"}}
	if err := f.c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
		Spec:       coderv1alpha1.CoderControlPlaneSpec{ExternalURL: coderURL, OperatorAccess: access},
	}
	if err := f.c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	return ccp
}

func (f *fixture) secret(t *testing.T, ns, name string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	err := f.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// tokenClient is a Coder client using the token the result points at.
func (f *fixture) tokenClient(t *testing.T, ccp *coderv1alpha1.CoderControlPlane, coderURL *url.URL, r operatoraccess.Result) *codersdk.Client {
	t.Helper()
	if r.TokenSecretRef == nil {
		t.Fatalf("result has no token Secret: %+v", r)
	}
	s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
	if s == nil {
		t.Fatalf("token Secret %s does not exist", r.TokenSecretRef.Name)
	}
	return coderapi.NewClient(coderURL, string(s.Data[r.TokenSecretRef.Key]), 5*time.Second, coderapi.Target{})
}

// expireIn makes the stored expiry of the operator token in r say it
// expires in left, and returns a client with that token.
func (f *fixture) expireIn(t *testing.T, ccp *coderv1alpha1.CoderControlPlane, coderURL *url.URL, r operatoraccess.Result, left time.Duration) *codersdk.Client {
	t.Helper()
	s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
	patch := client.MergeFrom(s.DeepCopy())
	s.Annotations["coder.com/token-expires-at"] = time.Now().Add(left).UTC().Format(time.RFC3339)
	if err := f.c.Patch(context.Background(), s, patch); err != nil {
		t.Fatal(err)
	}
	return f.tokenClient(t, ccp, coderURL, r)
}

// expireSoon makes the operator token in r about to expire.
func (f *fixture) expireSoon(t *testing.T, ccp *coderv1alpha1.CoderControlPlane, coderURL *url.URL, r operatoraccess.Result) *codersdk.Client {
	t.Helper()
	return f.expireIn(t, ccp, coderURL, r, time.Minute)
}

// ownerTokenAccess creates a control plane whose operator access starts
// from the test coderd's owner token, with the given token lifetime.
func (f *fixture) ownerTokenAccess(t *testing.T, name string, coder *testenv.Coder, lifetime time.Duration) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ccp := f.controlPlane(t, name, coder.URL.String(), coderv1alpha1.OperatorAccessSpec{
		OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"},
		TokenLifetime:       &metav1.Duration{Duration: lifetime},
	})
	if err := f.c.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ccp.Namespace},
		Data:       map[string][]byte{"token": []byte(coder.SessionToken)},
	}); err != nil {
		t.Fatal(err)
	}
	return ccp
}

// ownerCredentialsAccess creates a control plane whose operator access
// starts from the owner's email and password, in Secret "creds".
func (f *fixture) ownerCredentialsAccess(t *testing.T, name, coderURL, email, password string) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ccp := f.controlPlane(t, name, coderURL, coderv1alpha1.OperatorAccessSpec{
		OwnerCredentialsSecretRef: &corev1.LocalObjectReference{Name: "creds"},
	})
	if err := f.c.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: ccp.Namespace},
		Data:       map[string][]byte{"email": []byte(email), "password": []byte(password)},
	}); err != nil {
		t.Fatal(err)
	}
	return ccp
}

// issuedToken is the operator token as its Secret describes it and as
// coderd reports it.
type issuedToken struct {
	secret *corev1.Secret
	id     string
	// lifetime is the token Secret's coder.com/token-lifetime-seconds.
	lifetime string
	key      codersdk.APIKey
}

func (f *fixture) issuedToken(t *testing.T, ccp *coderv1alpha1.CoderControlPlane, coderURL *url.URL, r operatoraccess.Result) issuedToken {
	t.Helper()
	s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
	if s == nil {
		t.Fatalf("token Secret %s does not exist", r.TokenSecretRef.Name)
	}
	id := s.Annotations["coder.com/token-id"]
	key, err := f.tokenClient(t, ccp, coderURL, r).APIKeyByID(context.Background(), codersdk.Me, id)
	if err != nil {
		t.Fatalf("read the operator token %s from coderd: %v", id, err)
	}
	return issuedToken{secret: s, id: id, lifetime: s.Annotations["coder.com/token-lifetime-seconds"], key: *key}
}

func mustReady(t *testing.T, r operatoraccess.Result, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if !r.Ready {
		t.Fatalf("access not ready: %s: %s", r.Reason, r.Message)
	}
}

func TestFreshCoderd(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{SkipFirstUser: true})
	f := newFixture(t, k)
	ctx := context.Background()
	ccp := f.controlPlane(t, "fresh", coder.URL.String(), coderv1alpha1.OperatorAccessSpec{})

	r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
	mustReady(t, r, err)

	t.Run("first user set up, credentials readable by an admin", func(t *testing.T) {
		if r.AdminCredentialsSecret == "" {
			t.Fatal("no admin credentials Secret reported")
		}
		admin := f.secret(t, ccp.Namespace, r.AdminCredentialsSecret)
		c := coderapi.NewClient(coder.URL, "", 5*time.Second, coderapi.Target{})
		if _, err := c.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{
			Email: string(admin.Data["email"]), Password: string(admin.Data["password"]),
		}); err != nil {
			t.Fatalf("log in with the stored first user credentials: %v", err)
		}
	})

	t.Run("token belongs to the dedicated operator user, an owner", func(t *testing.T) {
		me, err := f.tokenClient(t, ccp, coder.URL, r).User(ctx, codersdk.Me)
		if err != nil {
			t.Fatalf("coderd rejects the operator token: %v", err)
		}
		if me.Username != operatoraccess.OperatorUsername || r.User != me.Username {
			t.Errorf("token user = %s (result says %s), want %s", me.Username, r.User, operatoraccess.OperatorUsername)
		}
		owner := false
		for _, role := range me.Roles {
			owner = owner || role.Name == codersdk.RoleOwner
		}
		if !owner {
			t.Errorf("operator user roles = %v, want owner", me.Roles)
		}
		if !strings.HasPrefix(r.CoderVersion, "v2.30.0") {
			t.Errorf("coder version = %q", r.CoderVersion)
		}
	})

	t.Run("token Secret is owned by the control plane and holds no other secret", func(t *testing.T) {
		s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != ccp.UID {
			t.Errorf("owner references = %+v", s.OwnerReferences)
		}
		if len(s.Data) != 1 {
			t.Errorf("token Secret keys = %d, want only %q", len(s.Data), coderapi.TokenKey)
		}
	})

	t.Run("steady state makes no writes", func(t *testing.T) {
		before := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name).ResourceVersion
		for range 3 {
			r2, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
			mustReady(t, r2, err)
		}
		if after := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name).ResourceVersion; after != before {
			t.Errorf("token Secret rewritten at steady state: %s -> %s", before, after)
		}
	})

	t.Run("a revoked token is detected and replaced", func(t *testing.T) {
		// Revalidate on every pass for this subtest.
		f.m.ValidateEvery = time.Nanosecond
		old := f.tokenClient(t, ccp, coder.URL, r)
		s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
		keys, err := old.Tokens(ctx, codersdk.Me, codersdk.TokensFilter{})
		if err != nil || len(keys) == 0 {
			t.Fatalf("list operator tokens: %v %v", keys, err)
		}
		for _, key := range keys {
			if err := old.DeleteAPIKey(ctx, codersdk.Me, key.ID); err != nil {
				t.Fatalf("revoke token in coderd: %v", err)
			}
		}
		if _, err := old.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			t.Fatalf("revoked token still works: %v", err)
		}
		r2, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r2, err)
		if _, err := f.tokenClient(t, ccp, coder.URL, r2).User(ctx, codersdk.Me); err != nil {
			t.Fatalf("replacement token rejected: %v", err)
		}
		if f.secret(t, ccp.Namespace, r2.TokenSecretRef.Name).ResourceVersion == s.ResourceVersion {
			t.Error("token Secret not updated")
		}
	})

	t.Run("a token near expiry is rotated and the old one revoked", func(t *testing.T) {
		old := f.expireSoon(t, ccp, coder.URL, r)
		r3, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r3, err)
		if _, err := f.tokenClient(t, ccp, coder.URL, r3).User(ctx, codersdk.Me); err != nil {
			t.Fatalf("rotated token rejected: %v", err)
		}
		f.revokedAfterDelay(t, ccp, coder.URL.String(), r3, old)
	})

	t.Run("disabling access revokes the token and deletes its Secret", func(t *testing.T) {
		s := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name)
		tok := coderapi.NewClient(coder.URL, string(s.Data[coderapi.TokenKey]), 5*time.Second, coderapi.Target{})
		ccp.Spec.OperatorAccess.Disabled = true
		r4, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		if err != nil {
			t.Fatal(err)
		}
		if r4.Ready || r4.Reason != coderv1alpha1.ReasonDisabled || r4.TokenSecretRef != nil {
			t.Errorf("result = %+v, want not ready, reason Disabled, no token", r4)
		}
		if f.secret(t, ccp.Namespace, r.TokenSecretRef.Name) != nil {
			t.Error("token Secret still exists")
		}
		if _, err := tok.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			t.Errorf("token still accepted by coderd after disabling: %v", err)
		}
	})

	t.Run("events tell the story", func(t *testing.T) {
		var got []string
		for len(f.rec.Events) > 0 {
			got = append(got, <-f.rec.Events)
		}
		all := strings.Join(got, "\n")
		for _, want := range []string{"FirstUserCreated", "OperatorTokenIssued", "OperatorTokenRotated", "OperatorTokenRevoked"} {
			if !strings.Contains(all, want) {
				t.Errorf("no %s event in:\n%s", want, all)
			}
		}
	})
}

func TestExistingCoderd(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	f := newFixture(t, k)
	ctx := context.Background()

	t.Run("without owner credentials access waits for them", func(t *testing.T) {
		ccp := f.controlPlane(t, "nocreds", coder.URL.String(), coderv1alpha1.OperatorAccessSpec{})
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		if err != nil {
			t.Fatal(err)
		}
		if r.Ready || r.Reason != coderv1alpha1.ReasonOwnerCredentialsRequired || !strings.Contains(r.Message, "ownerTokenSecretRef") {
			t.Errorf("result = %+v", r)
		}
	})

	t.Run("an owner token Secret gives access, once it exists", func(t *testing.T) {
		ref := &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"}
		ccp := f.controlPlane(t, "ownertoken", coder.URL.String(), coderv1alpha1.OperatorAccessSpec{OwnerTokenSecretRef: ref})
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		if err != nil {
			t.Fatal(err)
		}
		if r.Ready || r.Reason != coderv1alpha1.ReasonOwnerSecretMissing {
			t.Fatalf("result without the Secret = %+v", r)
		}
		if err := f.c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ccp.Namespace},
			Data:       map[string][]byte{"token": []byte(coder.SessionToken)},
		}); err != nil {
			t.Fatal(err)
		}
		r, err = f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		if me, err := f.tokenClient(t, ccp, coder.URL, r).User(ctx, codersdk.Me); err != nil || me.Username != operatoraccess.OperatorUsername {
			t.Fatalf("operator token: %v %v", me.Username, err)
		}
		if r.AdminCredentialsSecret != "" {
			t.Errorf("reports admin credentials %q although the operator created no first user", r.AdminCredentialsSecret)
		}

		// The owner token stops working (coderd caps owners' tokens at
		// 168h by default); the operator token, near its expiry, renews
		// itself and does not need it.
		owner := &corev1.Secret{}
		if err := f.c.Get(ctx, client.ObjectKey{Namespace: ccp.Namespace, Name: "owner"}, owner); err != nil {
			t.Fatal(err)
		}
		owner.Data["token"] = []byte("expired-owner-token")
		if err := f.c.Update(ctx, owner); err != nil {
			t.Fatal(err)
		}
		old := f.expireSoon(t, ccp, coder.URL, r)
		r2, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r2, err)
		if me, err := f.tokenClient(t, ccp, coder.URL, r2).User(ctx, codersdk.Me); err != nil || me.Username != operatoraccess.OperatorUsername {
			t.Fatalf("renewed operator token: %v %v", me.Username, err)
		}
		f.revokedAfterDelay(t, ccp, coder.URL.String(), r2, old)
	})

	t.Run("a token lifetime above coderd's maximum is capped at that maximum", func(t *testing.T) {
		// coderd refuses tokens longer than its maximum (for owners, like
		// the operator user, --max-admin-token-lifetime: 168h unless
		// configured otherwise); the operator asks for no more.
		const coderdMax = 168 * time.Hour
		ccp := f.ownerTokenAccess(t, "longtoken", coder, 720*time.Hour)
		before := time.Now()
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		after := time.Now()
		tok := f.issuedToken(t, ccp, coder.URL, r)
		if want := strconv.Itoa(int(coderdMax / time.Second)); tok.key.LifetimeSeconds != int64(coderdMax/time.Second) || tok.lifetime != want {
			t.Errorf("token lifetime: coderd says %ds, the Secret says %ss; want %s (168h)", tok.key.LifetimeSeconds, tok.lifetime, want)
		}
		if exp := tok.key.ExpiresAt; exp.Before(before.Add(coderdMax).Add(-time.Second)) || exp.After(after.Add(coderdMax).Add(time.Second)) {
			t.Errorf("token expires at %s, want 168h after it was issued (%s)", exp, before.Add(coderdMax))
		}
	})

	t.Run("a token is renewed once less than a third of its lifetime is left", func(t *testing.T) {
		// A 3h token is kept while more than 1h is left, and renewed
		// (for another 3h) below that.
		const lifetime, third = 3 * time.Hour, time.Hour
		ccp := f.ownerTokenAccess(t, "renewal", coder, lifetime)
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		issued := f.issuedToken(t, ccp, coder.URL, r)
		if issued.key.LifetimeSeconds != int64(lifetime/time.Second) || issued.lifetime != "10800" {
			t.Fatalf("token lifetime: coderd says %ds, the Secret says %ss; want 10800 (3h)", issued.key.LifetimeSeconds, issued.lifetime)
		}

		old := f.tokenClient(t, ccp, coder.URL, r)
		f.expireIn(t, ccp, coder.URL, r, third+time.Minute)
		kept := f.secret(t, ccp.Namespace, r.TokenSecretRef.Name).ResourceVersion
		r, err = f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		if now := f.issuedToken(t, ccp, coder.URL, r); now.id != issued.id || now.secret.ResourceVersion != kept {
			t.Errorf("with 1h1m of 3h left the token was replaced (id %s -> %s, Secret version %s -> %s); want it kept",
				issued.id, now.id, kept, now.secret.ResourceVersion)
		}

		f.expireIn(t, ccp, coder.URL, r, third-time.Minute)
		before := time.Now()
		r, err = f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		rotated := r
		renewed := f.issuedToken(t, ccp, coder.URL, r)
		if renewed.id == issued.id {
			t.Fatalf("with 59m of 3h left the token %s was kept; want it renewed", issued.id)
		}
		if renewed.key.LifetimeSeconds != int64(lifetime/time.Second) || renewed.lifetime != "10800" {
			t.Errorf("renewed token lifetime: coderd says %ds, the Secret says %ss; want 10800 (3h)", renewed.key.LifetimeSeconds, renewed.lifetime)
		}
		if exp := renewed.key.ExpiresAt; exp.Before(before.Add(lifetime).Add(-time.Second)) {
			t.Errorf("renewed token expires at %s, want 3h after renewal (%s)", exp, before.Add(lifetime))
		}
		f.revokedAfterDelay(t, ccp, coder.URL.String(), rotated, old)
	})

	t.Run("a license on the open-source coderd is reported as not supported", func(t *testing.T) {
		ccp := f.controlPlane(t, "licensed", coder.URL.String(), coderv1alpha1.OperatorAccessSpec{
			OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"},
		})
		ccp.Spec.License = &coderv1alpha1.LicenseSpec{SecretRef: coderv1alpha1.SecretKeyReference{Name: "license", Key: "jwt"}}
		for name, data := range map[string]map[string][]byte{
			"owner":   {"token": []byte(coder.SessionToken)},
			"license": {"jwt": []byte("eyJhbGciOiJFZERTQSJ9.e30.c2ln")},
		} {
			if err := f.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ccp.Namespace}, Data: data}); err != nil {
				t.Fatal(err)
			}
		}
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		if r.License == nil || r.License.Applied || r.License.Reason != coderv1alpha1.ReasonNotSupported || !strings.Contains(r.License.Message, "Route not found") {
			t.Errorf("license result = %+v, want not applied, NotSupported with Coder's message", r.License)
		}
		if r.Entitlements != nil {
			t.Errorf("entitlements = %+v from a coderd without the entitlements API", r.Entitlements)
		}
	})

	t.Run("wrong owner credentials are reported with Coder's message", func(t *testing.T) {
		ccp := f.ownerCredentialsAccess(t, "badcreds", coder.URL.String(), coder.Email, "wrong-password-1")
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		if err != nil {
			t.Fatal(err)
		}
		if r.Ready || r.Reason != coderv1alpha1.ReasonOwnerCredentialsRejected || !strings.Contains(r.Message, "creds") {
			t.Errorf("result = %+v", r)
		}
	})

	t.Run("correct owner credentials give access", func(t *testing.T) {
		ccp := f.ownerCredentialsAccess(t, "goodcreds", coder.URL.String(), coder.Email, coder.Password)
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
	})

	t.Run("an unreachable coderd is reported promptly", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		dead := "http://127.0.0.1:" + strconv.Itoa(port)
		ccp := f.controlPlane(t, "dead", dead, coderv1alpha1.OperatorAccessSpec{})
		start := time.Now()
		r, err := f.m.Reconcile(ctx, ccp, dead)
		if err != nil {
			t.Fatal(err)
		}
		if r.Ready || r.Reason != coderv1alpha1.ReasonCoderdUnreachable || r.RequeueAfter == 0 {
			t.Errorf("result = %+v", r)
		}
		if d := time.Since(start); d > 6*time.Second {
			t.Errorf("took %s, more than the Coder request timeout", d)
		}
	})
}

func clientKey(namespace, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: namespace, Name: name}
}
