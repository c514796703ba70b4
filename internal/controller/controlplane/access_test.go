package controlplane

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestAdoptedControlPlaneGetsOperatorAccess runs the reconciler with the
// real operator access manager against a real, fresh coderd: the operator
// sets up the first user itself, holds a token coderd accepts, reports it
// in the status, replaces it at once when told coderd rejected it (as the
// aggregated API does) although its next check is minutes away, and
// revokes it when the control plane is deleted.
func TestAdoptedControlPlaneGetsOperatorAccess(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{SkipFirstUser: true})
	ns := controllertest.Namespace(t, "adopt")
	ctx := context.Background()

	mgr := controllertest.NewManager(t, controllertest.Kube().Config, ns)
	access := &operatoraccess.Manager{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("operator-access"),
		Timeout:   15 * time.Second,
	}
	rechecks := make(chan event.TypedGenericEvent[types.NamespacedName], 1)
	r := &Reconciler{Access: access, Rechecks: rechecks}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	controllertest.StartManager(t, mgr)

	c := controllertest.Client(t)
	ccp := newControlPlane(ns, "coder")
	ccp.Spec.ExternalURL = coder.URL.String()
	create(t, c, ccp)

	eventually(t, 90*time.Second, "operator access ready", func() error {
		ccp = getCCP(t, c, ns, "coder")
		cond := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady)
		if cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("OperatorAccessReady = %+v", cond)
		}
		return nil
	})
	st := ccp.Status
	if st.URL != coder.URL.String() {
		t.Errorf("status.url = %q, want %q", st.URL, coder.URL)
	}
	if !apimeta.IsStatusConditionTrue(st.Conditions, coderv1alpha1.ConditionAvailable) || st.CoderVersion == "" {
		t.Errorf("Available/coderVersion = %+v / %q, want reachable with a version", apimeta.FindStatusCondition(st.Conditions, coderv1alpha1.ConditionAvailable), st.CoderVersion)
	}
	if st.Phase != coderv1alpha1.PhaseReady {
		t.Errorf("phase = %s, want Ready", st.Phase)
	}
	if st.OperatorUser == "" || st.AdminCredentialsSecretRef == nil {
		t.Errorf("operatorUser %q adminCredentialsSecretRef %v: the operator created the first user and should say so", st.OperatorUser, st.AdminCredentialsSecretRef)
	}
	if st.OperatorTokenSecretRef == nil {
		t.Fatal("no status.operatorTokenSecretRef")
	}

	token := readSecretKey(t, ns, st.OperatorTokenSecretRef.Name, st.OperatorTokenSecretRef.Key)
	u, err := url.Parse(st.URL)
	if err != nil {
		t.Fatal(err)
	}
	sdk := codersdk.New(u)
	sdk.SetSessionToken(token)
	me, err := sdk.User(ctx, codersdk.Me)
	if err != nil {
		t.Fatalf("coderd refuses the operator's token: %v", err)
	}
	if me.Username != st.OperatorUser {
		t.Errorf("token belongs to %q, status says %q", me.Username, st.OperatorUser)
	}

	// The token revoked in coderd behind the operator's back; the access
	// manager's next own check is 5 minutes away (its default), so only
	// the recheck request makes it notice now.
	secretKey := types.NamespacedName{Namespace: ns, Name: st.OperatorTokenSecretRef.Name}
	var secret corev1.Secret
	if err := c.Get(ctx, secretKey, &secret); err != nil {
		t.Fatal(err)
	}
	if err := sdk.DeleteAPIKey(ctx, codersdk.Me, secret.Annotations["coder.com/token-id"]); err != nil {
		t.Fatalf("revoke the operator token in coderd: %v", err)
	}
	if _, err := sdk.User(ctx, codersdk.Me); err == nil {
		t.Fatal("coderd still accepts the revoked token")
	}
	rechecks <- event.TypedGenericEvent[types.NamespacedName]{Object: types.NamespacedName{Namespace: ns, Name: "coder"}}
	eventually(t, 60*time.Second, "a new operator token after the recheck request", func() error {
		next := readSecretKey(t, ns, st.OperatorTokenSecretRef.Name, st.OperatorTokenSecretRef.Key)
		if next == token {
			return fmt.Errorf("the Secret still holds the revoked token")
		}
		sdk.SetSessionToken(next)
		if _, err := sdk.User(ctx, codersdk.Me); err != nil {
			return fmt.Errorf("coderd refuses the new token: %w", err)
		}
		return nil
	})

	// Deletion revokes the token.
	deleteCCP(t, c, ns, "coder", 60*time.Second)
	if _, err := sdk.User(ctx, codersdk.Me); err == nil {
		t.Error("coderd still accepts the operator's token after the control plane was deleted")
	}
}

func readSecretKey(t *testing.T, ns, name, key string) string {
	t.Helper()
	var s corev1.Secret
	if err := controllertest.Client(t).Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatalf("token Secret %s: %v", name, err)
	}
	v := string(s.Data[key])
	if v == "" {
		t.Fatalf("Secret %s has no key %q", name, key)
	}
	return v
}

// adoptWithOwnerToken runs the reconciler with the real access manager
// (replaced tokens revoked after revokeAfter; 0: the manager's default) on
// a control plane in ns that adopts coder with its owner's session token in
// a Secret, and waits until the operator holds its own token.
func adoptWithOwnerToken(t *testing.T, c client.Client, ns string, coder *testenv.Coder, revokeAfter time.Duration) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	mgr := controllertest.NewManager(t, controllertest.Kube().Config, ns)
	access := &operatoraccess.Manager{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("operator-access"),
		Timeout: 15 * time.Second, RevokeReplacedAfter: revokeAfter}
	if err := (&Reconciler{Access: access}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	controllertest.StartManager(t, mgr)

	create(t, c, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"},
		Data:       map[string][]byte{"token": []byte(coder.SessionToken)},
	})
	ccp := newControlPlane(ns, "coder")
	ccp.Spec.ExternalURL = coder.URL.String()
	ccp.Spec.OperatorAccess.OwnerTokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"}
	create(t, c, ccp)
	return waitConditionFor(t, 60*time.Second, c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionTrue, coderv1alpha1.ReasonTokenValid)
}

// TestURLChangeNeedsNewCredentials points an adopted control plane that
// holds access to a real coderd at a server the test runs (forwarding to
// the same coderd): the operator sends it no credential, and the
// condition, phase and a Warning event say new credentials are needed.
func TestURLChangeNeedsNewCredentials(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	ns := controllertest.Namespace(t, "urlchange")
	ctx := context.Background()
	c := controllertest.Client(t)
	adoptWithOwnerToken(t, c, ns, coder, 0)

	proxy := testenv.NewRecordingProxy(t, coder.URL)
	updateCCP(t, c, ns, "coder", func(ccp *coderv1alpha1.CoderControlPlane) { ccp.Spec.ExternalURL = proxy.URL.String() })
	ccp := waitConditionFor(t, 60*time.Second, c, ns, "coder", coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, coderv1alpha1.ReasonCredentialsURLMismatch)
	cond := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady)
	if !strings.Contains(cond.Message, coder.URL.String()) || !strings.Contains(cond.Message, proxy.URL.String()) || !strings.Contains(cond.Message, "Secret owner") {
		t.Errorf("condition message %q does not name both URLs and the Secret", cond.Message)
	}
	if ccp.Status.Phase != coderv1alpha1.PhaseFailed || ccp.Status.OperatorTokenSecretRef != nil {
		t.Errorf("phase %s, operatorTokenSecretRef %v; want Failed and no token in use", ccp.Status.Phase, ccp.Status.OperatorTokenSecretRef)
	}
	ev := waitEvent(t, ns, "coder", corev1.EventTypeWarning, coderv1alpha1.ReasonCredentialsURLMismatch)
	if !strings.Contains(ev.Note, proxy.URL.String()) {
		t.Errorf("event note %q does not name the new URL", ev.Note)
	}

	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	values := []string{coder.SessionToken, coder.Password}
	for _, s := range secrets.Items {
		for k, v := range s.Data {
			if k == coderapi.TokenKey || k == "token" || k == "password" {
				values = append(values, string(v))
			}
		}
	}
	for _, v := range values {
		if strings.Contains(cond.Message, v) || strings.Contains(ev.Note, v) {
			t.Error("the condition or event carries a credential")
		}
	}
	proxy.RequireNoCredential(t, values)
}

// TestRotatedTokenRevokedOnTime runs the reconciler with the real access
// manager: a rotation leaves the replaced token working, and the
// reconciler comes back by itself when its revocation is due (the access
// check interval, 5 minutes by default, is far away) and revokes it.
func TestRotatedTokenRevokedOnTime(t *testing.T) {
	const delay = 3 * time.Second
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	ns := controllertest.Namespace(t, "rotation")
	ctx := context.Background()
	c := controllertest.Client(t)
	ccp := adoptWithOwnerToken(t, c, ns, coder, delay)
	ref := ccp.Status.OperatorTokenSecretRef
	first := readSecretKey(t, ns, ref.Name, ref.Key)
	old := codersdk.New(coder.URL, codersdk.WithSessionToken(first))

	// The Secret says the token is near expiry: the Secret's change makes
	// the reconciler rotate it.
	var secret corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &secret); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(secret.DeepCopy())
	secret.Annotations["coder.com/token-expires-at"] = time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	if err := c.Patch(ctx, &secret, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a new operator token", func() error {
		if readSecretKey(t, ns, ref.Name, ref.Key) == first {
			return fmt.Errorf("the Secret still holds the first token")
		}
		return nil
	})
	rotated := time.Now()
	if _, err := old.User(ctx, codersdk.Me); err != nil {
		t.Fatalf("the replaced token was refused right after the rotation: %v", err)
	}
	eventually(t, delay+15*time.Second, "the replaced token revoked", func() error {
		if _, err := old.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			return fmt.Errorf("coderd still takes the replaced token (%v)", err)
		}
		return nil
	})
	if took := time.Since(rotated); took < delay-time.Second {
		t.Errorf("the replaced token was revoked %s after the rotation, before the %s delay", took, delay)
	}
	waitEvent(t, ns, "coder", corev1.EventTypeNormal, "OperatorTokenRevoked")
	next := codersdk.New(coder.URL, codersdk.WithSessionToken(readSecretKey(t, ns, ref.Name, ref.Key)))
	if _, err := next.User(ctx, codersdk.Me); err != nil {
		t.Errorf("coderd refuses the current token: %v", err)
	}
}
