package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestAggregatedStandaloneStaticBackend runs the binary in
// aggregated-apiserver mode, serving one coderd given in the configuration
// file (no CoderControlPlane anywhere), behind a real kube-apiserver, in
// both identity modes: Mapped (the default, the admin mapped to the
// session token's owner) and Operator (every caller acts with the session
// token).
func TestAggregatedStandaloneStaticBackend(t *testing.T) {
	t.Parallel()
	t.Run("Mapped", func(t *testing.T) { testStandaloneStaticBackend(t, true) })
	t.Run("Operator", func(t *testing.T) { testStandaloneStaticBackend(t, false) })
}

func testStandaloneStaticBackend(t *testing.T, mapped bool) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	opts := []stackOption{withStaticBackend(tokenFile)}
	if !mapped {
		opts = append(opts, withOperatorIdentity())
	}
	s := newStack(t, opts...)
	k, coder, op := s.k, s.coder, s.op
	ctx := context.Background()
	if _, err := coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	if _, err := coder.CreateWorkspace(ctx, "base", "ws-static"); err != nil {
		t.Fatal(err)
	}
	ns, other := s.ns, "other"
	for _, n := range []string{ns, other} {
		if err := k.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}

	wsName := s.workspaceName("ws-static")
	if wsName != "coder.admin.ws-static" {
		t.Fatalf("workspace name %q, want coder.admin.ws-static", wsName)
	}
	workspaces := s.dyn.Resource(workspacesGVR)

	t.Run("secure port /readyz answers anonymous probes", func(t *testing.T) {
		code, status, err := getWith(insecureClient, op.Aggregated+"/readyz")
		if err != nil || code != http.StatusOK {
			t.Fatalf("anonymous GET /readyz on the secure port: %s %v, want 200", status, err)
		}
	})

	t.Run("kubectl lists the workspace in the static backend's namespace", func(t *testing.T) {
		out := s.must(t, "get", "coderworkspaces", "-n", ns)
		if !strings.Contains(out, wsName) {
			t.Fatalf("kubectl get coderworkspaces -n %s does not list %s:\n%s", ns, wsName, out)
		}
		for _, col := range []string{"NAME", "OWNER", "TEMPLATE"} {
			if !strings.Contains(out, col) {
				t.Errorf("kubectl get coderworkspaces lacks column %s:\n%s", col, out)
			}
		}
	})

	t.Run("other namespaces show nothing", func(t *testing.T) {
		out := s.must(t, "get", "coderworkspaces", "-n", other)
		if strings.Contains(out, wsName) || !strings.Contains(out, "No resources found") {
			t.Errorf("kubectl get coderworkspaces -n %s:\n%s", other, out)
		}
		_, err := workspaces.Namespace(other).Get(ctx, wsName, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("get %s in namespace %s: %v, want NotFound", wsName, other, err)
		}
		all, err := workspaces.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range all.Items {
			if it.GetNamespace() != ns {
				t.Errorf("list across namespaces has %s in namespace %s", it.GetName(), it.GetNamespace())
			}
		}
	})

	t.Run("objects carry no control-plane label", func(t *testing.T) {
		obj, err := workspaces.Namespace(ns).Get(ctx, wsName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		labels := obj.GetLabels()
		if v, ok := labels[aggv1.LabelControlPlane]; ok {
			t.Errorf("label %s=%q on a static backend's object", aggv1.LabelControlPlane, v)
		}
		if labels[aggv1.LabelOwner] != coder.Username || labels[aggv1.LabelOrganization] != "coder" {
			t.Errorf("labels %v lack owner %s / organization coder", labels, coder.Username)
		}
		out := s.must(t, "get", "cws", "-n", ns, "-o", "name", "-l", "!"+aggv1.LabelControlPlane)
		if !strings.Contains(out, wsName) {
			t.Errorf("-l !%s does not select %s:\n%s", aggv1.LabelControlPlane, wsName, out)
		}
	})

	t.Run("token file rotation: a new token is used, a refused one gives 403, restoring recovers", func(t *testing.T) {
		const member = "member@example.com"
		if mapped {
			if _, err := coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
				Email: member, Username: "member", Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{coder.OrganizationID},
				UserLoginType: codersdk.LoginTypePassword,
			}); err != nil {
				t.Fatal(err)
			}
		}
		newToken, err := coder.Client.CreateToken(ctx, codersdk.Me, codersdk.CreateTokenRequest{TokenName: "coder-k8s-rotated", Lifetime: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		// usingToken waits until the operator has logged picking up the
		// token file's n-th change.
		usingToken := func(n int) {
			t.Helper()
			testenv.WaitFor(t, 15*time.Second, func() error {
				if log, _ := os.ReadFile(op.LogPath); strings.Count(string(log), "session token file changed: using the new token") < n {
					return errNotYet(fmt.Sprintf("the operator has not logged picking up the token file's change %d", n))
				}
				return nil
			})
		}
		writeTokenFile(t, tokenFile, newToken.Key)
		usingToken(1)
		// Revoke the original session: from now on only the new token
		// can be the one in use.
		original := coder.SessionToken
		if err := coder.Client.Logout(ctx); err != nil {
			t.Fatalf("log out the original session: %v", err)
		}
		revoked := codersdk.New(coder.URL)
		revoked.SetSessionToken(original)
		if _, err := revoked.User(ctx, codersdk.Me); err == nil {
			t.Fatal("the original session token still works after logout")
		}
		out := s.must(t, "get", "coderworkspaces", "-n", ns)
		if !strings.Contains(out, wsName) {
			t.Fatalf("after rotating to a new token, kubectl get does not list %s:\n%s", wsName, out)
		}

		// A token coderd refuses (the revoked one). It refuses every
		// caller in Operator mode; in Mapped mode every caller whose Coder
		// user coder-k8s holds no token for yet, which only the session
		// token can mint (callers it minted one for before keep acting
		// with their own): here a Coder member, matched by email, in
		// system:masters for RBAC.
		caller, kubectl := workspaces, s.run
		if mapped {
			cfg, err := s.k.UserConfig(member, "system:masters")
			if err != nil {
				t.Fatal(err)
			}
			caller = dynamicFor(t, cfg).Resource(workspacesGVR)
			kubeconfig, err := s.k.UserKubeconfig(member, "system:masters")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "kubeconfig")
			if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
				t.Fatal(err)
			}
			kubectl = func(args ...string) (string, error) {
				r, err := testenv.Kubectl{Path: s.kubectl, Flags: []string{"--kubeconfig", path}}.Run(ctx, "", args...)
				return r.Combined, err
			}
		}
		writeTokenFile(t, tokenFile, original)
		usingToken(2)
		var listErr error
		testenv.WaitFor(t, 15*time.Second, func() error {
			_, listErr = caller.Namespace(ns).List(ctx, metav1.ListOptions{})
			if !apierrors.IsForbidden(listErr) {
				return errNotYet(fmt.Sprintf("list with a revoked token: %v, want 403 Forbidden", listErr))
			}
			return nil
		})
		const hint = "aggregatedAPIServer.coder.staticBackend"
		if !strings.Contains(listErr.Error(), hint) {
			t.Errorf("LIST with a revoked token: the 403 does not name the static backend (%s): %v", hint, listErr)
		}
		_, getErr := caller.Namespace(ns).Get(ctx, wsName, metav1.GetOptions{})
		if !apierrors.IsForbidden(getErr) || !strings.Contains(getErr.Error(), hint) {
			t.Errorf("GET with a revoked token: %v, want 403 Forbidden naming %s", getErr, hint)
		}
		if out, err := kubectl("get", "coderworkspaces", "-n", ns); err == nil || !strings.Contains(out, "Forbidden") {
			t.Errorf("kubectl get with a revoked token: %v\n%s", err, out)
		}

		// Restoring a valid token recovers without a restart.
		writeTokenFile(t, tokenFile, newToken.Key)
		testenv.WaitFor(t, 15*time.Second, func() error {
			_, err := caller.Namespace(ns).List(ctx, metav1.ListOptions{})
			return err
		})
		if out, err := kubectl("get", "coderworkspaces", "-n", ns); err != nil {
			t.Errorf("after restoring the token, kubectl get as the refused caller: %v\n%s", err, out)
		}
		out = s.must(t, "get", "coderworkspaces", "-n", ns)
		if !strings.Contains(out, wsName) {
			t.Errorf("after restoring the token, kubectl get does not list %s:\n%s", wsName, out)
		}
	})
}

// TestAggregatedCoderdDown stops answering from coderd behind an adopted
// control plane: requests that need coderd fail fast with 503 naming it,
// while the aggregated API itself stays registered, available and ready.
func TestAggregatedCoderdDown(t *testing.T) {
	t.Parallel()
	const coderTimeout = 3 * time.Second
	// The slack covers kube-apiserver's proxying and the client; a
	// request held for the default 30s Coder timeout exceeds it.
	const bound = coderTimeout + 5*time.Second
	s := newStack(t, withAggregated(fmt.Sprintf("coder: {requestTimeout: %s}", coderTimeout)))
	ctx := context.Background()
	wsName := s.seedWorkspace(t, "ws-down")
	workspaces := s.dyn.Resource(workspacesGVR).Namespace(s.ns)
	testenv.WaitFor(t, 30*time.Second, func() error { return listed(ctx, workspaces, wsName) })
	agg, err := aggregatorclient.NewForConfig(s.k.Config)
	if err != nil {
		t.Fatal(err)
	}
	before := modesAPIServiceAvailable(ctx, t, agg)
	if before.Status != apiregistrationv1.ConditionTrue {
		t.Fatalf("APIService not Available before coderd stops: %s %s", before.Reason, before.Message)
	}

	// expect503 runs a request and asserts a 503 naming the unreachable
	// coderd, within bound.
	expect503 := func(t *testing.T, what string, req func() error) {
		t.Helper()
		start := time.Now()
		err := req()
		took := time.Since(start)
		t.Logf("%s: %s after %s", what, err, took.Round(time.Millisecond))
		if !apierrors.IsServiceUnavailable(err) {
			t.Errorf("%s: %v (status %d), want 503 ServiceUnavailable\noperator log:\n%s", what, err, modesStatusCode(err), s.op.LogTail(20))
			return
		}
		if msg := err.Error(); !strings.Contains(msg, "coderd at "+s.coder.URL.String()) || !strings.Contains(msg, "unreachable") {
			t.Errorf("%s: the 503 does not say coderd at %s is unreachable: %s", what, s.coder.URL, msg)
		}
		if took > bound {
			t.Errorf("%s took %s; with coder.requestTimeout %s it should fail within %s", what, took, coderTimeout, bound)
		}
	}
	list := func() error { _, err := workspaces.List(ctx, metav1.ListOptions{}); return err }
	get := func() error { _, err := workspaces.Get(ctx, wsName, metav1.GetOptions{}); return err }

	// stillServed asserts what must not depend on coderd.
	stillServed := func(t *testing.T) {
		t.Helper()
		res, err := s.k.Clientset.Discovery().ServerResourcesForGroupVersion(aggv1.SchemeGroupVersion.String())
		if err != nil {
			t.Errorf("discovery of %s through kube-apiserver: %v", aggv1.SchemeGroupVersion, err)
		} else {
			found := false
			for _, r := range res.APIResources {
				found = found || r.Name == "coderworkspaces"
			}
			if !found {
				t.Errorf("discovery of %s lacks coderworkspaces: %v", aggv1.SchemeGroupVersion, res.APIResources)
			}
		}
		if c := modesAPIServiceAvailable(ctx, t, agg); c.Status != apiregistrationv1.ConditionTrue {
			t.Errorf("APIService Available=%s (%s: %s)", c.Status, c.Reason, c.Message)
		}
		code, status, err := getWith(insecureClient, s.op.Aggregated+"/readyz")
		if err != nil || code != http.StatusOK {
			t.Errorf("operator /readyz on the secure port: %s %v, want 200", status, err)
		}
	}

	t.Run("hung coderd: 503 within the Coder request timeout", func(t *testing.T) {
		// A stopped process still accepts connections (the kernel
		// queues them) but never answers: each call waits for the
		// client timeout.
		if err := s.coder.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.coder.Process.Signal(syscall.SIGCONT) }()
		expect503(t, "LIST coderworkspaces", list)
		expect503(t, "GET coderworkspace "+wsName, get)
		stillServed(t)
	})

	t.Run("coderd process gone: 503, the API stays registered, available and ready", func(t *testing.T) {
		s.coder.Process.Stop(15 * time.Second)
		if !refusesConnections(s.coder.URL.String()) {
			t.Fatalf("coderd at %s still accepts connections", s.coder.URL)
		}
		expect503(t, "LIST coderworkspaces", list)
		expect503(t, "GET coderworkspace "+wsName, get)
		out, err := s.run("get", "coderworkspaces", "-n", s.ns)
		if err == nil || !strings.Contains(out, "ServiceUnavailable") {
			t.Errorf("kubectl get coderworkspaces with coderd down: %v\n%s", err, out)
		}
		stillServed(t)

		// The aggregator re-checks APIServices every 30s: stay through
		// one check and keep asserting the API stays Available and
		// requests keep failing with 503 (not an empty list).
		deadline := time.Now().Add(35 * time.Second)
		for time.Now().Before(deadline) {
			if c := modesAPIServiceAvailable(ctx, t, agg); c.Status != apiregistrationv1.ConditionTrue {
				t.Fatalf("APIService became Available=%s (%s: %s) while coderd is down", c.Status, c.Reason, c.Message)
			}
			time.Sleep(time.Second)
		}
		after := modesAPIServiceAvailable(ctx, t, agg)
		if !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
			t.Errorf("APIService Available condition transitioned (at %s, was %s)", after.LastTransitionTime, before.LastTransitionTime)
		}
		expect503(t, "LIST coderworkspaces 35s later", list)
		stillServed(t)
	})
}

// modesAPIServiceAvailable returns the Available condition of the
// aggregation.coder.com APIService.
func modesAPIServiceAvailable(ctx context.Context, t *testing.T, agg aggregatorclient.Interface) apiregistrationv1.APIServiceCondition {
	t.Helper()
	svc, err := agg.ApiregistrationV1().APIServices().Get(ctx, "v1alpha1."+aggv1.GroupName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get APIService: %v", err)
	}
	for _, c := range svc.Status.Conditions {
		if c.Type == apiregistrationv1.Available {
			return c
		}
	}
	return apiregistrationv1.APIServiceCondition{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionUnknown, Reason: "NoCondition"}
}

// listed is a condition for testenv.WaitFor: nil once a list of r holds
// an object called name, the list's error, or errNotYet.
func listed(ctx context.Context, r dynamic.ResourceInterface, name string) error {
	list, err := r.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if !modesHasName(list, name) {
		return errNotYet("list lacks " + name)
	}
	return nil
}

func modesHasName(list *unstructured.UnstructuredList, name string) bool {
	for _, it := range list.Items {
		if it.GetName() == name {
			return true
		}
	}
	return false
}

func modesStatusCode(err error) int32 {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code
	}
	return 0
}
