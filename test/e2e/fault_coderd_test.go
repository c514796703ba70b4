package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The operator's settings in TestFaultCoderd (cf: coderd fault): short
// enough that every fault shows, and is recovered from, within seconds.
const (
	// cfCoderTimeout is aggregatedAPIServer.coder.requestTimeout and
	// controller.coderRequestTimeout: the longest one call to coderd waits.
	cfCoderTimeout = 3 * time.Second
	// cfCheckInterval is controller.operatorAccessCheckInterval: how
	// often the controller asks each coderd whether it answers and still
	// takes the operator's token, and at most how long it waits to ask an
	// unreachable one again.
	cfCheckInterval = 3 * time.Second
	// cfToolTimeout is mcp.toolTimeout.
	cfToolTimeout = 10 * time.Second
	// cfSlack covers kube-apiserver's proxying, kubectl and the test's
	// clients on a loaded two-core machine. A request held for the
	// default 30s Coder timeout still exceeds timeout+slack.
	cfSlack = 5 * time.Second
)

// TestFaultCoderd runs one stack (kube-apiserver, coderd, and the operator
// in all mode: controller, aggregated API and MCP in one process) while
// coderd misbehaves in three ways, in order, each recovered from before
// the next: coderd slow (behind a delaying proxy), the operator's token
// revoked in coderd, and coderd stopped and started again on the same
// address and database. Namespace "coder" adopts coderd directly,
// namespace "slow" through the proxy.
func TestFaultCoderd(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd, PostgreSQL and coderd from bin/ (make tools)")
	}
	start := time.Now()
	// coder/coder adopts coderd directly; "slow" (below) through the
	// proxy, which delays requests on demand.
	s := newStack(t, withCoderdProxy(false), withOperator(OperatorOptions{
		Aggregated: fmt.Sprintf("coder: {requestTimeout: %s}", cfCoderTimeout),
		Controller: []string{
			"coderRequestTimeout: " + cfCoderTimeout.String(),
			"operatorAccessCheckInterval: " + cfCheckInterval.String(),
		},
		MCP: "toolTimeout: " + cfToolTimeout.String(),
	}))
	proxy := s.proxy
	ctx := context.Background()
	wsName := s.seedWorkspace(t, "ws-fault")
	const slowNS = "slow"
	adoptControlPlane(t, s, slowNS, "coder", proxy.URL.String())
	cfWaitAccess(t, s, slowNS, 60*time.Second, metav1.ConditionTrue, metav1.ConditionTrue)

	// An agent allowed to list workspaces everywhere.
	agentToken := e2eMCPServiceAccountToken(t, s, "fault-agent")
	e2eMCPGrant(t, s, "fault-agent", "", rbacv1.PolicyRule{
		APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list"},
	})
	agent := (&e2eMCPRecorder{}).connect(t, s.op.MCP, agentToken)

	// Both control planes serve the workspace before any fault.
	for _, ns := range []string{s.ns, slowNS} {
		testenv.WaitFor(t, 60*time.Second, func() error {
			list, err := s.dyn.Resource(workspacesGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			if !modesHasName(list, wsName) {
				return errNotYet("namespace " + ns + ": list lacks " + wsName)
			}
			return nil
		})
	}
	t.Logf("stack ready after %s", time.Since(start).Round(time.Millisecond))

	t.Run("slow coderd: requests end within the Coder timeout, resources return to the baseline", func(t *testing.T) {
		testSlowCoderd(t, s, proxy, agent, slowNS, wsName)
	})
	t.Run("operator token revoked in coderd: a new one is issued and the aggregated API recovers", func(t *testing.T) {
		testTokenRevoked(t, s, wsName)
	})
	t.Run("coderd stopped and started again: 503, API available, watch kept, status says unreachable, recovery", func(t *testing.T) {
		testCoderdRestart(t, s, agent, wsName)
	})

	if exited, err := s.op.Exited(); exited {
		t.Errorf("the operator exited (%v); it must ride out every coderd fault", err)
	}
	if log := testenv.LogTail(s.op.LogPath, 1_000_000); strings.Contains(log, "panic") {
		t.Errorf("the operator logged a panic:\n%s", s.op.LogTail(60))
	}
	t.Logf("TestFaultCoderd took %s", time.Since(start).Round(time.Millisecond))
}

// testSlowCoderd (scenario B) delays every request to coderd behind the
// "slow" control plane beyond the Coder request timeout.
func testSlowCoderd(t *testing.T, s *aggStack, proxy *testenv.CountingProxy, agent *e2eMCPAgent, slowNS, wsName string) {
	ctx := context.Background()
	slow := s.dyn.Resource(workspacesGVR).Namespace(slowNS)
	// Warm every path the fault exercises, so the baseline includes the
	// connections and caches steady operation keeps.
	for range 3 {
		if _, err := slow.List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if res := agent.call(t, "list_workspaces", map[string]any{"namespace": slowNS}, nil); res.IsError {
			t.Fatalf("list_workspaces before the fault: %s", e2eMCPText(res))
		}
	}
	base := cfBaseline(t, s.op)
	t.Logf("baseline before the fault: %d goroutines, heap in use %.1f MiB", base.goroutines, base.heapMiB())

	const delay = 30 * time.Second // longer than every timeout involved
	proxy.SetDelay(delay)
	delayed := true
	defer func() {
		if delayed {
			proxy.SetDelay(0)
		}
	}()
	bound := cfCoderTimeout + cfSlack

	// A burst of requests at once: aggregated LISTs and GETs through
	// kube-apiserver, and MCP tool calls.
	burst := func(t *testing.T, when string) {
		t.Helper()
		type outcome struct {
			what  string
			isMCP bool
			took  time.Duration
			err   error
			tool  *mcp.CallToolResult
		}
		var mu sync.Mutex
		var outcomes []outcome
		var wg sync.WaitGroup
		run := func(what string, isMCP bool, f func(context.Context) (*mcp.CallToolResult, error)) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Far beyond every bound: a hung request fails the test
				// instead of hanging it.
				rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				start := time.Now()
				res, err := f(rctx)
				mu.Lock()
				outcomes = append(outcomes, outcome{what: what, isMCP: isMCP, took: time.Since(start), err: err, tool: res})
				mu.Unlock()
			}()
		}
		for i := range 6 {
			run(fmt.Sprintf("LIST coderworkspaces -n %s #%d", slowNS, i), false, func(ctx context.Context) (*mcp.CallToolResult, error) {
				_, err := slow.List(ctx, metav1.ListOptions{})
				return nil, err
			})
		}
		for i := range 3 {
			run(fmt.Sprintf("GET coderworkspace %s/%s #%d", slowNS, wsName, i), false, func(ctx context.Context) (*mcp.CallToolResult, error) {
				_, err := slow.Get(ctx, wsName, metav1.GetOptions{})
				return nil, err
			})
		}
		for i := range 3 {
			run(fmt.Sprintf("MCP list_workspaces %s #%d", slowNS, i), true, func(ctx context.Context) (*mcp.CallToolResult, error) {
				return agent.session.CallTool(ctx, &mcp.CallToolParams{Name: "list_workspaces", Arguments: map[string]any{"namespace": slowNS}})
			})
		}
		wg.Wait()
		var slowest time.Duration
		for _, o := range outcomes {
			slowest = max(slowest, o.took)
			if o.isMCP {
				// MCP: an isError result naming the unreachable coderd,
				// within the tool timeout.
				switch {
				case o.err != nil:
					t.Errorf("%s %s: a protocol error instead of an isError result: %v", when, o.what, o.err)
				case !o.tool.IsError:
					t.Errorf("%s %s: succeeded although coderd does not answer in time: %+v", when, o.what, o.tool.StructuredContent)
				case !strings.Contains(e2eMCPText(o.tool), "coderd at "+proxy.URL.String()) || !strings.Contains(e2eMCPText(o.tool), "unreachable"):
					t.Errorf("%s %s: the error does not say coderd at %s is unreachable: %s", when, o.what, proxy.URL, e2eMCPText(o.tool))
				}
				if o.took > cfToolTimeout+cfSlack {
					t.Errorf("%s %s took %s; the tool timeout is %s", when, o.what, o.took, cfToolTimeout)
				}
				continue
			}
			cfExpectUnavailable(t, when+" "+o.what, o.err, o.took, bound, proxy.URL.String())
		}
		t.Logf("%s: %d requests, the slowest took %s (bound %s)", when, len(outcomes), slowest.Round(time.Millisecond), bound)
	}

	t.Run("as soon as coderd is slow", func(t *testing.T) { burst(t, "slow coderd") })

	// The controller's own checks time out too: the status says so, and
	// the control plane keeps being served (503s, not an empty list).
	ccp := cfWaitAccess(t, s, slowNS, cfCheckInterval+2*cfCoderTimeout+cfSlack, metav1.ConditionUnknown, metav1.ConditionFalse)
	t.Logf("control plane %s/coder while coderd is slow: %s", slowNS, conditionSummary(ccp.Status.Conditions))
	t.Run("after the controller noticed", func(t *testing.T) { burst(t, "slow coderd, status Unavailable") })

	t.Run("the other control plane is not slowed down", func(t *testing.T) {
		start := time.Now()
		list, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil || !modesHasName(list, wsName) {
			t.Fatalf("LIST in namespace %s while %s's coderd is slow: %v", s.ns, slowNS, err)
		}
		if took := time.Since(start); took > bound {
			t.Errorf("LIST in namespace %s took %s while another control plane's coderd is slow", s.ns, took)
		}
	})

	during := cfReadMetrics(t, s.op)
	proxy.SetDelay(0)
	delayed = false
	t.Logf("during the fault: %d goroutines, heap in use %.1f MiB; %d delayed requests abandoned by their clients",
		during.goroutines, during.heapMiB(), proxy.Abandoned())

	t.Run("recovery once coderd is fast again", func(t *testing.T) {
		start := time.Now()
		testenv.WaitFor(t, cfCoderTimeout+cfSlack, func() error { return listed(ctx, slow, wsName) })
		cfWaitAccess(t, s, slowNS, cfCheckInterval+cfCoderTimeout+cfSlack, metav1.ConditionTrue, metav1.ConditionTrue)
		if res := agent.call(t, "list_workspaces", map[string]any{"namespace": slowNS}, nil); res.IsError {
			t.Errorf("list_workspaces after recovery: %s", e2eMCPText(res))
		}
		t.Logf("recovered in %s", time.Since(start).Round(time.Millisecond))
	})

	t.Run("goroutines and heap return near the baseline", func(t *testing.T) {
		// Tolerances: goroutines come and go with in-flight requests and
		// idle connections (20 is about ten connections); the heap moves
		// with the garbage collector's pacing, so half again the baseline
		// or 16 MiB, whichever is more.
		maxGoroutines := base.goroutines + 20
		maxHeap := max(base.heapInuse*3/2, base.heapInuse+16<<20)
		var last cfMetrics
		start := time.Now()
		testenv.WaitFor(t, 60*time.Second, func() error {
			last = cfReadMetrics(t, s.op)
			if last.goroutines > maxGoroutines || last.heapInuse > maxHeap {
				return fmt.Errorf("%d goroutines (baseline %d, at most %d), heap in use %.1f MiB (baseline %.1f, at most %.1f)",
					last.goroutines, base.goroutines, maxGoroutines, last.heapMiB(), base.heapMiB(), float64(maxHeap)/(1<<20))
			}
			return nil
		})
		t.Logf("after %s: %d goroutines (baseline %d), heap in use %.1f MiB (baseline %.1f)",
			time.Since(start).Round(time.Millisecond), last.goroutines, base.goroutines, last.heapMiB(), base.heapMiB())
	})
}

// testTokenRevoked (scenario C) deletes the operator's current token of
// control plane coder/coder in coderd, as coderd's admin. Unlike a
// rotation (TestOperatorTokenRotation: the replaced token keeps working
// until every reader has switched, and no request fails), nothing valid is
// left to call coderd with until the controller has issued a new token
// with the owner session: requests needing the operator's session in that
// window are refused, and the test checks they are refused honestly.
func testTokenRevoked(t *testing.T, s *aggStack, wsName string) {
	ctx := context.Background()
	var ccp coderv1alpha1.CoderControlPlane
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
		t.Fatal(err)
	}
	oldToken := operatorToken(t, s, &ccp)
	// In Mapped mode the admin lists with a token of their own that
	// coder-k8s minted earlier; a caller it has no token for yet needs the
	// operator's to be mapped: a second Coder owner, matched by email.
	const owner2 = "owner2@example.com"
	u, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: owner2, Username: "owner2", Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
		UserLoginType: codersdk.LoginTypePassword,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.Client.UpdateUserRoles(ctx, u.ID.String(), codersdk.UpdateRoles{Roles: []string{codersdk.RoleOwner}}); err != nil {
		t.Fatal(err)
	}
	cfg, err := s.k.UserConfig(owner2, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	// The token's ID is the part of the key before the dash.
	oldID, _, ok := strings.Cut(oldToken, "-")
	if !ok {
		t.Fatalf("the operator token in Secret %s is not a Coder API key", ccp.Status.OperatorTokenSecretRef.Name)
	}
	if err := s.coder.Client.DeleteAPIKey(ctx, operatoraccess.OperatorUsername, oldID); err != nil {
		t.Fatalf("revoke the operator's token as coderd's admin: %v", err)
	}
	revokedAt := time.Now()
	old := codersdk.New(s.coder.URL)
	old.SetSessionToken(oldToken)
	if _, err := old.User(ctx, codersdk.Me); err == nil {
		t.Fatal("the revoked operator token still works in coderd")
	}

	// The controller's next check finds the token refused and issues a
	// new one; the aggregated API picks the new Secret up.
	workspaces := dynamicFor(t, cfg).Resource(workspacesGVR).Namespace(s.ns)
	var seen []string
	bound := cfCheckInterval + 2*cfCoderTimeout + cfSlack
	testenv.WaitFor(t, bound, func() error {
		list, err := workspaces.List(ctx, metav1.ListOptions{})
		if err != nil {
			if len(seen) == 0 || seen[len(seen)-1] != err.Error() {
				seen = append(seen, err.Error())
			}
			return err
		}
		if !modesHasName(list, wsName) {
			return errNotYet("list lacks " + wsName)
		}
		return nil
	})
	t.Logf("the aggregated API recovered %s after the revocation; errors seen meanwhile: %q",
		time.Since(revokedAt).Round(time.Millisecond), seen)
	for _, e := range seen {
		// While coderd refuses the operator's only token, the answer is
		// a 403 naming the control plane, never a 500 or an empty list.
		if !strings.Contains(e, "operator access to control plane "+s.ns+"/coder was refused") {
			t.Errorf("while the token was revoked the aggregated API answered: %s", e)
		}
	}

	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
		t.Fatal(err)
	}
	if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) || ccp.Status.OperatorTokenSecretRef == nil {
		t.Fatalf("control plane %s/coder after recovery: %s", s.ns, conditionSummary(ccp.Status.Conditions))
	}
	newToken := operatorToken(t, s, &ccp)
	if newToken == oldToken {
		t.Error("the operator token Secret still holds the revoked token")
	}
	fresh := codersdk.New(s.coder.URL)
	fresh.SetSessionToken(newToken)
	if me, err := fresh.User(ctx, codersdk.Me); err != nil || me.Username != operatoraccess.OperatorUsername {
		t.Errorf("the new operator token in coderd: user %q, %v", me.Username, err)
	}
	cfExpectEvent(t, s, s.ns, "OperatorTokenRotated")
}

// testCoderdRestart (scenario A) stops coderd, holds the outage through
// one of kube-apiserver's APIService availability checks, and starts it
// again on the same address and database.
func testCoderdRestart(t *testing.T, s *aggStack, agent *e2eMCPAgent, wsName string) {
	ctx := context.Background()
	workspaces := s.dyn.Resource(workspacesGVR).Namespace(s.ns)
	agg, err := aggregatorclient.NewForConfig(s.k.Config)
	if err != nil {
		t.Fatal(err)
	}
	before := modesAPIServiceAvailable(ctx, t, agg)
	if before.Status != apiregistrationv1.ConditionTrue {
		t.Fatalf("APIService not Available before coderd stops: %s %s", before.Reason, before.Message)
	}

	// A watch opened while coderd answers, as `kubectl get -w` does.
	list, err := workspaces.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := cfWatch(t, s, list.GetResourceVersion())

	s.coder.StopServer(15 * time.Second)
	stoppedAt := time.Now()
	restarted := false
	defer func() {
		if !restarted {
			// The next tests of this process need no coderd, but the
			// cleanup's log tail is more useful with one.
			_ = s.coder.StartServer(ctx)
		}
	}()
	if !refusesConnections(s.coder.URL.String()) {
		t.Fatalf("coderd at %s still accepts connections", s.coder.URL)
	}
	bound := cfCoderTimeout + cfSlack
	coderURL := s.coder.URL.String()
	requests := func(t *testing.T, when string) {
		t.Helper()
		start := time.Now()
		_, err := workspaces.List(ctx, metav1.ListOptions{})
		cfExpectUnavailable(t, when+": LIST coderworkspaces", err, time.Since(start), bound, coderURL)
		start = time.Now()
		_, err = workspaces.Get(ctx, wsName, metav1.GetOptions{})
		cfExpectUnavailable(t, when+": GET coderworkspace "+wsName, err, time.Since(start), bound, coderURL)
	}

	t.Run("aggregated LIST and GET: 503 naming coderd", func(t *testing.T) {
		requests(t, "coderd stopped")
		out, err := s.run("get", "coderworkspaces", "-n", s.ns)
		if err == nil || !strings.Contains(out, "ServiceUnavailable") || !strings.Contains(out, "unreachable") {
			t.Errorf("kubectl get coderworkspaces with coderd stopped: %v\n%s", err, out)
		}
	})

	t.Run("MCP list_workspaces: an isError result naming coderd", func(t *testing.T) {
		// The tool lists at resourceVersion 0, which the watch cache may
		// answer while its last poll is at most two poll intervals old
		// (the open watch keeps it polling): after that, the error.
		cached := 0
		testenv.WaitFor(t, 2*pollInterval+cfSlack, func() error {
			start := time.Now()
			res := agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns}, nil)
			took := time.Since(start)
			if took > cfToolTimeout+cfSlack {
				t.Errorf("list_workspaces took %s; the tool timeout is %s", took, cfToolTimeout)
			}
			text := e2eMCPText(res)
			if !res.IsError {
				cached++
				return errNotYet("list_workspaces answered from the watch cache: " + text)
			}
			if !strings.Contains(text, "coderd at "+coderURL) || !strings.Contains(text, "unreachable") {
				return fmt.Errorf("list_workspaces with coderd stopped: the error does not say coderd at %s is unreachable: %q", coderURL, text)
			}
			return nil
		})
		t.Logf("list_workspaces failed %s after coderd stopped (%d answers from the watch cache before)", time.Since(stoppedAt).Round(time.Millisecond), cached)
	})

	t.Run("the controller reports coderd unreachable", func(t *testing.T) {
		ccp := cfWaitAccess(t, s, s.ns, cfCheckInterval+cfCoderTimeout+cfSlack, metav1.ConditionUnknown, metav1.ConditionFalse)
		t.Logf("%s after coderd stopped: phase %s, %s", time.Since(stoppedAt).Round(time.Millisecond), ccp.Status.Phase, conditionSummary(ccp.Status.Conditions))
		if ccp.Status.Phase != coderv1alpha1.PhaseDegraded {
			t.Errorf("phase %s, want %s while coderd is unreachable", ccp.Status.Phase, coderv1alpha1.PhaseDegraded)
		}
		cfExpectEvent(t, s, s.ns, "Unavailable")
		// Still served: the last token is kept, so requests keep
		// failing with 503 rather than the workspace disappearing.
		requests(t, "status Unavailable")
	})

	t.Run("discovery and the APIService stay available through the aggregator's recheck", func(t *testing.T) {
		// kube-apiserver re-checks APIServices every 30s: stay past that
		// since the stop, asserting availability all along.
		deadline := stoppedAt.Add(35 * time.Second)
		for {
			if c := modesAPIServiceAvailable(ctx, t, agg); c.Status != apiregistrationv1.ConditionTrue {
				t.Fatalf("APIService Available=%s (%s: %s) while coderd is down", c.Status, c.Reason, c.Message)
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		after := modesAPIServiceAvailable(ctx, t, agg)
		if !after.LastTransitionTime.Equal(&before.LastTransitionTime) {
			t.Errorf("APIService Available condition transitioned (at %s, was %s)", after.LastTransitionTime, before.LastTransitionTime)
		}
		res, err := s.k.Clientset.Discovery().ServerResourcesForGroupVersion(aggv1.SchemeGroupVersion.String())
		if err != nil || !cfHasResource(res.APIResources, "coderworkspaces") {
			t.Errorf("discovery of %s through kube-apiserver: %v %v", aggv1.SchemeGroupVersion, err, res)
		}
		out, err := s.run("api-resources", "--api-group", aggv1.GroupName)
		if err != nil || !strings.Contains(out, "coderworkspaces") {
			t.Errorf("kubectl api-resources --api-group %s: %v\n%s", aggv1.GroupName, err, out)
		}
		if code, status, err := getWith(insecureClient, s.op.Aggregated+"/readyz"); err != nil || code != http.StatusOK {
			t.Errorf("operator /readyz on the secure port: %s %v, want 200", status, err)
		}
		requests(t, "35s into the outage")
	})

	if err := s.coder.StartServer(ctx); err != nil {
		t.Fatalf("start coderd again: %v", err)
	}
	restarted = true
	back := time.Now()
	t.Logf("coderd was down %s", back.Sub(stoppedAt).Round(time.Millisecond))

	t.Run("recovery without restarting the operator", func(t *testing.T) {
		testenv.WaitFor(t, cfCoderTimeout+cfSlack, func() error { return listed(ctx, workspaces, wsName) })
		t.Logf("aggregated LIST works %s after coderd is back", time.Since(back).Round(time.Millisecond))
		ccp := cfWaitAccess(t, s, s.ns, cfCheckInterval+cfCoderTimeout+cfSlack, metav1.ConditionTrue, metav1.ConditionTrue)
		t.Logf("status recovered %s after coderd is back: phase %s", time.Since(back).Round(time.Millisecond), ccp.Status.Phase)
		testenv.WaitFor(t, cfCheckInterval+cfSlack, func() error {
			if err := s.c.Get(ctx, client.ObjectKeyFromObject(ccp), ccp); err != nil {
				return err
			}
			if ccp.Status.Phase != coderv1alpha1.PhaseReady {
				return errNotYet("phase " + string(ccp.Status.Phase))
			}
			return nil
		})
		if res := agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns}, nil); res.IsError {
			t.Errorf("list_workspaces after coderd is back: %s", e2eMCPText(res))
		}
	})

	t.Run("the watch opened before the outage is still open and sees a change made after it", func(t *testing.T) {
		if _, err := s.coder.StopWorkspace(ctx, "ws-fault"); err != nil {
			t.Fatal(err)
		}
		changed := time.Now()
		ev := w.waitEvent(t, 30*time.Second, func(e watch.Event) bool {
			obj, ok := e.Object.(*unstructured.Unstructured)
			if !ok || e.Type != watch.Modified || obj.GetName() != wsName {
				return false
			}
			running, found, _ := unstructured.NestedBool(obj.Object, "spec", "running")
			return found && !running
		})
		t.Logf("watch event %s %s %s after the stop build finished", ev.Type, wsName, time.Since(changed).Round(time.Millisecond))
		for _, e := range w.all() {
			if e.Type == watch.Deleted || e.Type == watch.Error {
				t.Errorf("the watch got a %s event during or after the outage: %v", e.Type, e.Object)
			}
		}
	})
}

// cfWaitAccess waits until control plane ns/coder reports, for the
// generation it has, OperatorAccessReady with status access and Available
// with status available; anything but True must carry the reason
// CoderdUnreachable and say so in its message.
func cfWaitAccess(t *testing.T, s *aggStack, ns string, timeout time.Duration, access, available metav1.ConditionStatus) *coderv1alpha1.CoderControlPlane {
	t.Helper()
	ctx := context.Background()
	ccp := &coderv1alpha1.CoderControlPlane{}
	testenv.WaitFor(t, timeout, func() error {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "coder"}, ccp); err != nil {
			return err
		}
		for typ, want := range map[string]metav1.ConditionStatus{coderv1alpha1.ConditionOperatorAccessReady: access, coderv1alpha1.ConditionAvailable: available} {
			c := apimeta.FindStatusCondition(ccp.Status.Conditions, typ)
			switch {
			case c == nil || c.Status != want:
				return errNotYet(fmt.Sprintf("%s/coder: %s is not %s: %s", ns, typ, want, conditionSummary(ccp.Status.Conditions)))
			case c.ObservedGeneration != ccp.Generation:
				return errNotYet(fmt.Sprintf("%s/coder: %s observed generation %d of %d", ns, typ, c.ObservedGeneration, ccp.Generation))
			case want != metav1.ConditionTrue && (c.Reason != coderv1alpha1.ReasonCoderdUnreachable || !strings.Contains(c.Message, "unreachable")):
				return fmt.Errorf("%s/coder: %s=%s with reason %s: %s; want reason %s", ns, typ, c.Status, c.Reason, c.Message, coderv1alpha1.ReasonCoderdUnreachable)
			}
		}
		if ccp.Status.OperatorTokenSecretRef == nil {
			return errNotYet(ns + "/coder: status.operatorTokenSecretRef is not set")
		}
		return nil
	})
	return ccp
}

// cfExpectUnavailable asserts that a request failed within bound with a
// 503 (or 504) saying coderd at coderURL is unreachable.
func cfExpectUnavailable(t *testing.T, what string, err error, took, bound time.Duration, coderURL string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s succeeded after %s although coderd does not answer", what, took)
		return
	case !apierrors.IsServiceUnavailable(err) && !apierrors.IsTimeout(err):
		t.Errorf("%s: %v (status %d), want 503 ServiceUnavailable or 504 Timeout", what, err, modesStatusCode(err))
	case !strings.Contains(err.Error(), "coderd at "+coderURL) || !strings.Contains(err.Error(), "unreachable"):
		t.Errorf("%s: the %d does not say coderd at %s is unreachable: %v", what, modesStatusCode(err), coderURL, err)
	}
	if took > bound {
		t.Errorf("%s took %s; with a Coder request timeout of %s it must end within %s", what, took, cfCoderTimeout, bound)
	}
}

// cfExpectEvent waits for an event with reason about control plane
// ns/coder, as `kubectl events` shows it.
func cfExpectEvent(t *testing.T, s *aggStack, ns, reason string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, func() error {
		events, err := s.k.Clientset.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		var reasons []string
		for _, e := range events.Items {
			if e.Regarding.Kind == "CoderControlPlane" && e.Regarding.Name == "coder" {
				if e.Reason == reason {
					return nil
				}
				reasons = append(reasons, e.Reason)
			}
		}
		return errNotYet(fmt.Sprintf("no %s event about %s/coder (events: %v)", reason, ns, reasons))
	})
}

func cfHasResource(rs []metav1.APIResource, name string) bool {
	for _, r := range rs {
		if r.Name == name {
			return true
		}
	}
	return false
}

// cfWatcher records the events of a client-go watch on the stack's
// namespace.
type cfWatcher struct {
	mu     sync.Mutex
	events []watch.Event
	closed bool
}

func cfWatch(t *testing.T, s *aggStack, resourceVersion string) *cfWatcher {
	t.Helper()
	w, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Watch(context.Background(), metav1.ListOptions{ResourceVersion: resourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	fw := &cfWatcher{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.ResultChan() {
			fw.mu.Lock()
			fw.events = append(fw.events, e)
			fw.mu.Unlock()
		}
		fw.mu.Lock()
		fw.closed = true
		fw.mu.Unlock()
	}()
	t.Cleanup(func() {
		w.Stop()
		<-done
	})
	return fw
}

// waitEvent waits for an event match accepts; it fails the test if the
// watch ends first.
func (w *cfWatcher) waitEvent(t *testing.T, timeout time.Duration, match func(watch.Event) bool) watch.Event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		for _, e := range w.events {
			if match(e) {
				w.mu.Unlock()
				return e
			}
		}
		closed, n := w.closed, len(w.events)
		w.mu.Unlock()
		if closed {
			t.Fatalf("the watch ended (after %d events) before the expected event", n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no expected watch event within %s; got %d events: %v", timeout, n, w.summary())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *cfWatcher) all() []watch.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]watch.Event(nil), w.events...)
}

func (w *cfWatcher) summary() []string {
	var out []string
	for _, e := range w.all() {
		name := ""
		if o, ok := e.Object.(metav1.Object); ok {
			name = o.GetName()
		}
		out = append(out, string(e.Type)+" "+name)
	}
	return out
}

// cfMetrics is what the operator's /metrics says of its own resources.
type cfMetrics struct {
	goroutines int
	heapInuse  int64
}

func (m cfMetrics) heapMiB() float64 { return float64(m.heapInuse) / (1 << 20) }

// cfReadMetrics scrapes the operator's /metrics (controller-runtime's
// registry, which holds the Go collector).
func cfReadMetrics(t *testing.T, op *Operator) cfMetrics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, op.Metrics+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s/metrics: %v", op.Metrics, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s/metrics: %s", op.Metrics, resp.Status)
	}
	var m cfMetrics
	found := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || (name != "go_goroutines" && name != "go_memstats_heap_inuse_bytes") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("metric %s: value %q: %v", name, value, err)
		}
		found[name] = true
		if name == "go_goroutines" {
			m.goroutines = int(v)
		} else {
			m.heapInuse = int64(v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s/metrics: %v", op.Metrics, err)
	}
	if !found["go_goroutines"] || !found["go_memstats_heap_inuse_bytes"] {
		t.Fatalf("%s/metrics lacks go_goroutines or go_memstats_heap_inuse_bytes", op.Metrics)
	}
	return m
}

// cfBaseline samples the operator's metrics for a few seconds and keeps
// the highest figures: the steady state's own swing is not a leak.
func cfBaseline(t *testing.T, op *Operator) cfMetrics {
	t.Helper()
	var base cfMetrics
	for i := range 5 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		m := cfReadMetrics(t, op)
		base.goroutines = max(base.goroutines, m.goroutines)
		base.heapInuse = max(base.heapInuse, m.heapInuse)
	}
	return base
}
