package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// gracefulShutdown is the operator's bound on stopping after SIGTERM
// (internal/app), below the default 30s pod termination grace period.
const gracefulShutdown = 25 * time.Second

// TestProcessFaults runs the operator through process faults on one
// kube-apiserver and one coderd: kube-apiserver restarting under it, two
// replicas handing the leader Lease over when the leader is killed or
// stopped, and SIGTERM while requests wait for coderd builds.
func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd, PostgreSQL and coderd from bin/")
	}
	start := time.Now()
	f := newFaultStack(t)
	t.Logf("stack up in %s", time.Since(start).Round(time.Millisecond))

	t.Run("kube-apiserver restart", f.kubeAPIServerRestart)
	t.Run("two replicas hand the lease over", f.leaderHandover)
	t.Run("SIGTERM during a template build and a workspace start", f.sigtermDuringBuilds)
}

// faultStack is what the scenarios share: the stack without an operator
// (each scenario starts its own with startOperator and routes the
// APIService to it with routeAPIService), whose CoderControlPlane
// "coder/coder" adopts its coderd, an agent's ServiceAccount token and the
// Terraform state gate.
type faultStack struct {
	*aggStack
	// token is a ServiceAccount token allowed to read the aggregated
	// resources and the control planes, for direct calls and MCP.
	token string
	gate  *stateGate
}

const faultNS = "coder"

func newFaultStack(t *testing.T) *faultStack {
	t.Helper()
	f := &faultStack{aggStack: newStack(t, withoutOperator())}
	f.token = f.agentToken(t)
	f.gate = newStateGate(t)
	return f
}

// waitAccess waits until the control plane "coder/coder" has working
// operator access, which the aggregated API needs to reach coderd.
func (f *faultStack) waitAccess(t *testing.T) {
	t.Helper()
	waitOperatorAccess(t, f.aggStack, faultNS, "coder", f.coder.URL.String(), 90*time.Second)
}

// kubectlRun runs kubectl as the cluster admin, bounded by timeout.
func (f *faultStack) kubectlRun(timeout time.Duration, stdin string, args ...string) (string, error) {
	return runKubectl(f.kubectl, f.k, timeout, stdin, args...)
}

// A: kube-apiserver goes away and comes back on the same port with the
// same etcd and certificates. The same operator process reconnects: its
// caches resync (objects created and changed since are reconciled), the
// aggregated API answers through kube-apiserver again, and every readiness
// endpoint returns to ok.
func (f *faultStack) kubeAPIServerRestart(t *testing.T) {
	ctx := context.Background()
	// Leadership survives an outage shorter than renewDeadline; a longer
	// one makes the process exit on purpose (controller-runtime's rule, so
	// that no two replicas reconcile), which is not this scenario. A
	// restart on a loaded two-core machine can take longer than the 10s
	// default, so the deadline here is generous.
	op := f.startOperator(t, OperatorOptions{LeaderElection: "leaseDuration: 60s, renewDeadline: 45s, retryPeriod: 2s"})
	f.routeAPIService(t, op)
	f.waitAccess(t)
	const ns = "fault-restart"
	if err := f.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	before := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "before", Namespace: ns}}
	if err := f.c.Create(ctx, before); err != nil {
		t.Fatal(err)
	}
	f.waitReconciled(t, ns, "before", 1, 60*time.Second)
	if _, err := f.kubectlRun(time.Minute, "", "get", "coderworkspaces", "-n", faultNS); err != nil {
		t.Fatalf("aggregated API through kube-apiserver before the restart: %v", err)
	}
	pid, err := processID(op)
	if err != nil {
		t.Fatal(err)
	}
	holder := f.leaseHolder(t, op.LeaseName)
	if holder == "" {
		t.Fatal("the operator holds no lease before the restart")
	}

	down := time.Now()
	if err := f.k.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	// Long enough for watches and lease renewals to fail at least once.
	time.Sleep(3 * time.Second)
	if exited, err := op.Exited(); exited {
		t.Fatalf("the operator exited while kube-apiserver was down: %v\n%s", err, op.LogTail(40))
	}
	if code, _, err := get(ctx, op.Health+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("healthz while kube-apiserver is down: %d %v (liveness must not fail on an outage)", code, err)
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := f.k.StartAPIServer(startCtx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver down for %s (stop, 3s pause, start until /readyz)", back.Sub(down).Round(time.Millisecond))

	// Changes made right after the restart, while the operator's watches
	// may still be re-establishing: the resync must pick them up.
	patch := client.MergeFrom(before.DeepCopy())
	before.Spec.Replicas = ptr(int32(2))
	if err := f.c.Patch(ctx, before, patch); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Create(ctx, &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "after", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	f.waitReconciled(t, ns, "before", 2, 90*time.Second)
	f.waitReconciled(t, ns, "after", 1, 90*time.Second)
	t.Logf("changes made after the restart reconciled %s after kube-apiserver was back", time.Since(back).Round(time.Millisecond))

	testenv.WaitFor(t, 90*time.Second, func() error {
		_, err := f.kubectlRun(30*time.Second, "", "get", "coderworkspaces,codertemplates", "-n", faultNS)
		return err
	})
	t.Logf("aggregated API answering through kube-apiserver %s after it was back", time.Since(back).Round(time.Millisecond))
	for _, url := range []string{op.Health + "/readyz", op.Aggregated + "/readyz", op.MCP + "/readyz"} {
		op.WaitOK(t, url)
	}

	if exited, err := op.Exited(); exited {
		t.Fatalf("the operator exited: %v\n%s", err, op.LogTail(40))
	}
	if after, err := processID(op); err != nil || after != pid {
		t.Errorf("operator PID %d before the restart, %d (%v) after: it was restarted", pid, after, err)
	}
	if h := f.leaseHolder(t, op.LeaseName); h != holder {
		t.Errorf("lease holder %q before the restart, %q after", holder, h)
	}
	if log := testenv.LogTail(op.LogPath, 1_000_000); strings.Contains(log, "panic") {
		t.Errorf("the operator logged a panic:\n%s", op.LogTail(60))
	}
}

// waitReconciled waits until the managed control plane ns/name has a
// Deployment with replicas and a status that has observed its generation.
func (f *faultStack) waitReconciled(t *testing.T, ns, name string, replicas int32, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, timeout, func() error {
		var ccp coderv1alpha1.CoderControlPlane
		if err := f.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ccp); err != nil {
			return err
		}
		if ccp.Status.ObservedGeneration != ccp.Generation {
			return fmt.Errorf("%s/%s: observedGeneration %d, generation %d", ns, name, ccp.Status.ObservedGeneration, ccp.Generation)
		}
		var deps appsv1.DeploymentList
		if err := f.c.List(ctx, &deps, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, d := range deps.Items {
			if metav1.IsControlledBy(&d, &ccp) {
				if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
					return fmt.Errorf("%s/%s: Deployment %s has replicas %v, want %d", ns, name, d.Name, d.Spec.Replicas, replicas)
				}
				return nil
			}
		}
		return fmt.Errorf("%s/%s: no Deployment owned by it", ns, name)
	})
}

// leaseHolder returns the holder of Lease default/name ("" when free).
func (f *faultStack) leaseHolder(t *testing.T, name string) string {
	t.Helper()
	l, err := f.k.Clientset.CoordinationV1().Leases("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease %s: %v", name, err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// B: two replicas share one Lease with short settings. Only the leader
// reconciles; when it is killed the other takes the Lease over and
// reconciles a new change within the lease duration plus a margin; when
// the next leader is stopped with SIGTERM it releases the Lease and the
// handover is immediate. Every replica serves the aggregated API and MCP
// throughout: the survivors answer every call made during the handovers.
func (f *faultStack) leaderHandover(t *testing.T) {
	ctx := context.Background()
	const (
		lease         = "coder-k8s-fault-replicas"
		leaseDuration = 6 * time.Second
		retryPeriod   = time.Second
		ns            = "fault-replicas"
		// margin covers what follows a takeover on a loaded machine:
		// starting the controllers and one reconcile.
		margin = 10 * time.Second
	)
	opts := OperatorOptions{LeaseName: lease, LeaderElection: "leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s"}
	r1 := f.startOperator(t, opts)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if f.leaseHolder(t, lease) == "" {
			return errNotYet("nobody holds the lease")
		}
		return isLeader(ctx, r1, lease, true)
	})
	f.waitAccess(t)
	r2 := f.startOperator(t, opts)
	holder1 := f.leaseHolder(t, lease)

	if err := f.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "handover", Namespace: ns}}
	if err := f.c.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	f.waitReconciled(t, ns, "handover", 1, 60*time.Second)

	t.Run("only the leader reconciles", func(t *testing.T) {
		if err := isLeader(ctx, r2, lease, false); err != nil {
			t.Error(err)
		}
		n1, err := metricSum(ctx, r1.Metrics, "controller_runtime_reconcile_total", `controller="codercontrolplane"`)
		if err != nil {
			t.Fatal(err)
		}
		n2, err := metricSum(ctx, r2.Metrics, "controller_runtime_reconcile_total", `controller="codercontrolplane"`)
		if err != nil {
			t.Fatal(err)
		}
		if n1 == 0 || n2 != 0 {
			t.Errorf("codercontrolplane reconciles: leader %v, follower %v; want some on the leader only", n1, n2)
		}
	})

	p1 := f.startProbe(t, "replica 1", r1)
	p2 := f.startProbe(t, "replica 2", r2)
	// Some calls on both before anything happens.
	testenv.WaitFor(t, 30*time.Second, func() error { return errors.Join(p1.atLeast(5), p2.atLeast(5)) })

	t.Run("SIGKILL: the follower takes over within the lease duration", func(t *testing.T) {
		killed := time.Now()
		if err := r1.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p1.stop()
		t.Logf("before the kill: %s", p1.summary())
		// A change made the moment the leader is gone.
		patch := client.MergeFrom(cp.DeepCopy())
		cp.Spec.Replicas = ptr(int32(3))
		if err := f.c.Patch(ctx, cp, patch); err != nil {
			t.Fatal(err)
		}
		var acquired time.Duration
		testenv.WaitFor(t, leaseDuration+margin, func() error {
			if err := isLeader(ctx, r2, lease, true); err != nil {
				return err
			}
			acquired = time.Since(killed)
			return nil
		})
		f.waitReconciled(t, ns, "handover", 3, leaseDuration+margin-time.Since(killed))
		reconciled := time.Since(killed)
		t.Logf("after SIGKILL of the leader: replica 2 leads after %s, the change made at the kill reconciled after %s (lease duration %s)",
			acquired.Round(time.Millisecond), reconciled.Round(time.Millisecond), leaseDuration)
		if h := f.leaseHolder(t, lease); h == "" || h == holder1 {
			t.Errorf("lease holder %q after the takeover (the killed leader was %q)", h, holder1)
		}
		// Keep polling the survivor a moment past the takeover.
		time.Sleep(time.Second)
		p2.requireNoFailures(t)
		if n, err := metricSum(ctx, r2.Metrics, "controller_runtime_reconcile_total", `controller="codercontrolplane"`); err != nil || n == 0 {
			t.Errorf("the new leader shows %v codercontrolplane reconciles (%v)", n, err)
		}
	})

	t.Run("SIGTERM: the leader releases the lease and the handover is immediate", func(t *testing.T) {
		r3 := f.startOperator(t, opts)
		p3 := f.startProbe(t, "replica 3", r3)
		testenv.WaitFor(t, 30*time.Second, func() error { return p3.atLeast(5) })
		if err := isLeader(ctx, r3, lease, false); err != nil {
			t.Fatal(err)
		}
		holder2 := f.leaseHolder(t, lease)
		termed := time.Now()
		if err := r2.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var exited time.Time
		testenv.WaitFor(t, gracefulShutdown+5*time.Second, func() error {
			done, err := r2.Exited()
			if !done {
				return errNotYet("replica 2 still running")
			}
			if err != nil {
				return fmt.Errorf("replica 2 exited with %v after SIGTERM; log tail:\n%s", err, r2.LogTail(30))
			}
			exited = time.Now()
			return nil
		})
		p2.stop()
		patch := client.MergeFrom(cp.DeepCopy())
		cp.Spec.Replicas = ptr(int32(1))
		if err := f.c.Patch(ctx, cp, patch); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, leaseDuration+margin, func() error { return isLeader(ctx, r3, lease, true) })
		acquired := time.Now()
		f.waitReconciled(t, ns, "handover", 1, 30*time.Second)
		t.Logf("after SIGTERM of the leader: it exited after %s, replica 3 leads %s after the exit (%s after SIGTERM), change reconciled %s after SIGTERM",
			exited.Sub(termed).Round(time.Millisecond), acquired.Sub(exited).Round(time.Millisecond),
			acquired.Sub(termed).Round(time.Millisecond), time.Since(termed).Round(time.Millisecond))
		// The stopped leader renewed the Lease up to retryPeriod before it
		// exited: had it not released it, nobody could take it before
		// leaseDuration-retryPeriod after the exit.
		if d := acquired.Sub(exited); d >= leaseDuration-retryPeriod {
			t.Errorf("replica 3 took the lease %s after the leader exited: the lease was not released on SIGTERM", d)
		}
		if h := f.leaseHolder(t, lease); h == "" || h == holder2 {
			t.Errorf("lease holder %q after the handover (the stopped leader was %q)", h, holder2)
		}
		time.Sleep(time.Second)
		p3.requireNoFailures(t)
		p3.stop()
		p2.requireNoFailuresBefore(t, termed)
	})
	if t.Failed() {
		return
	}
	if err := f.k.Clientset.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Logf("delete namespace %s: %v", ns, err)
	}
}

// isLeader checks an operator's own word on leadership: its
// leader_election_master_status gauge for lease.
func isLeader(ctx context.Context, op *Operator, lease string, want bool) error {
	v, err := metricSum(ctx, op.Metrics, "leader_election_master_status", `name="`+lease+`"`)
	if err != nil {
		return err
	}
	if (v == 1) != want {
		return fmt.Errorf("%s: leader_election_master_status %v, want leader=%v", op.Metrics, v, want)
	}
	return nil
}

// metricSum adds up the samples of metric on an operator's /metrics whose
// labels include every one of labels (`key="value"`).
func metricSum(ctx context.Context, metricsURL, metric string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: %s", metricsURL, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || (!strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ")) {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(rest, l)
		}
		fields := strings.Fields(rest)
		if !match || len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// probe calls one replica every 200ms, rotating through a LIST of
// coderworkspaces and of codertemplates on its secure port (authenticated
// by kube-apiserver from a ServiceAccount token) and an MCP tool call, and
// records every failure. The rotation keeps the load on coderd below its
// per-endpoint rate limit.
type probe struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	ok       int
	failures []probeFailure
}

type probeFailure struct {
	at  time.Time
	err error
}

func (f *faultStack) startProbe(t *testing.T, name string, op *Operator) *probe {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(f.caPEM)
	// A new connection per call: net/http's graceful shutdown closes idle
	// keep-alive connections, and a call written on one at that instant
	// gets EOF without reaching the server, which would pass for a call
	// the stopping replica dropped. A connection it accepted is served.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	ctx, cancel := context.WithCancel(context.Background())
	session, err := mcpclient.Connect(ctx, op.MCP+"/mcp", mcpclient.Options{Token: f.token, Transport: &http.Transport{DisableKeepAlives: true}})
	if err != nil {
		cancel()
		t.Fatalf("%s: connect to MCP: %v", name, err)
	}
	p := &probe{name: name, cancel: cancel, done: make(chan struct{})}
	calls := []func(context.Context) error{
		func(ctx context.Context) error {
			return f.directList(ctx, hc, op, "coderworkspaces", "CoderWorkspaceList")
		},
		func(ctx context.Context) error {
			res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "list_control_planes", Arguments: map[string]any{"namespace": faultNS}})
			if err != nil {
				return fmt.Errorf("MCP list_control_planes: %w", err)
			}
			if res.IsError || !strings.Contains(e2eMCPText(res), `"coder"`) {
				return fmt.Errorf("MCP list_control_planes: %s", e2eMCPText(res))
			}
			return nil
		},
		func(ctx context.Context) error {
			return f.directList(ctx, hc, op, "codertemplates", "CoderTemplateList")
		},
	}
	go func() {
		defer close(p.done)
		defer session.Close()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			err := calls[i%len(calls)](cctx)
			ccancel()
			if ctx.Err() != nil {
				return // stopped mid-call: not the replica's failure
			}
			p.mu.Lock()
			if err != nil {
				p.failures = append(p.failures, probeFailure{at: time.Now(), err: err})
			} else {
				p.ok++
			}
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// directList lists resource in the faultNS namespace from op's secure
// port, as kube-apiserver's aggregation layer would, but with the agent's
// bearer token (delegated authentication and authorization).
func (f *faultStack) directList(ctx context.Context, hc *http.Client, op *Operator, resource, kind string) error {
	url := fmt.Sprintf("%s/apis/%s/v1alpha1/namespaces/%s/%s", op.Aggregated, aggv1.GroupName, faultNS, resource)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("LIST %s: %w", resource, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"kind":"`+kind+`"`)) {
		return fmt.Errorf("LIST %s: %s %.300s", resource, resp.Status, body)
	}
	return nil
}

// stop ends the polling and waits for the last call.
func (p *probe) stop() {
	p.cancel()
	<-p.done
}

func (p *probe) atLeast(n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ok < n {
		return fmt.Errorf("%s: %d successful calls so far, %d failures", p.name, p.ok, len(p.failures))
	}
	return nil
}

func (p *probe) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%s: %d calls answered, %d failed", p.name, p.ok, len(p.failures))
}

func (p *probe) requireNoFailures(t *testing.T) {
	t.Helper()
	p.requireNoFailuresBefore(t, time.Now().Add(time.Hour))
}

// requireNoFailuresBefore fails the test on any failed call before
// stopping, and after it on anything but a refused connection: a replica
// that stops listening turns new calls away, but fails none it accepted.
func (p *probe) requireNoFailuresBefore(t *testing.T, stopping time.Time) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	t.Logf("%s: %d calls answered, %d failed", p.name, p.ok, len(p.failures))
	var bad []string
	for _, f := range p.failures {
		if f.at.Before(stopping) || !strings.Contains(f.err.Error(), "connection refused") {
			bad = append(bad, f.at.Format("15:04:05.000")+" "+f.err.Error())
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s failed %d of %d calls:\n%s", p.name, len(bad), p.ok+len(p.failures), strings.Join(bad, "\n"))
	}
}

// agentToken creates ServiceAccount agents/fault-agent, allowed to read
// the aggregated resources and control planes everywhere, and returns a
// token for it from the TokenRequest API.
func (f *faultStack) agentToken(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	const ns, name = "agents", "fault-agent"
	if err := f.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "codertemplates"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list", "watch"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}},
	}
	for _, o := range objs {
		if err := f.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	expiry := int64(3600)
	tr, err := f.k.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// C: SIGTERM while a template version builds in the background, and while
// a workspace start build runs. The process exits 0 well inside the
// graceful shutdown bound and releases its Lease, and nothing is left half
// done: after a restart the template's build is carried on from its record
// and Kubernetes shows what coderd has.
func (f *faultStack) sigtermDuringBuilds(t *testing.T) {
	ctx := context.Background()
	const tplName = "slow"
	k8sTemplate := "coder." + tplName
	wsName := "coder." + f.coder.Username + ".ws-fault"
	manifest := writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: %s, namespace: %s}
spec:
  files:
    main.tf: |
%s`, k8sTemplate, faultNS, indent(f.gate.template(), 6)))

	t.Run("during a template build", func(t *testing.T) {
		op := f.startOperator(t, OperatorOptions{})
		f.routeAPIService(t, op)
		f.waitAccess(t)

		f.gate.hold()
		reads := f.gate.reads()
		// Builds run in the background: the create returns at once.
		if out, err := f.kubectlRun(time.Minute, "", "create", "-f", manifest); err != nil {
			t.Fatalf("kubectl create: %v\n%s", err, out)
		}
		testenv.WaitFor(t, 90*time.Second, func() error {
			if f.gate.reads() == reads {
				return errNotYet("the template build has not reached the gate")
			}
			return nil
		})
		tpl, err := f.coder.Client.TemplateByName(ctx, f.coder.OrganizationID, tplName)
		if err != nil {
			t.Fatalf("coderd has no template right after the create: %v", err)
		}
		// The pending build does not hold the shutdown.
		f.terminate(t, op)
		f.requireReleased(t, op)
		f.gate.release()

		op2 := f.startOperator(t, OperatorOptions{})
		f.routeAPIService(t, op2)
		f.waitAccess(t)
		// The restarted operator carries the build on from its record.
		if out, err := f.kubectlRun(4*time.Minute, "", "wait", "--for=condition=Ready", "codertemplate/"+k8sTemplate, "-n", faultNS, "--timeout=3m"); err != nil {
			t.Fatalf("kubectl wait after the restart: %v\n%s\noperator log:\n%s", err, out, op2.LogTail(30))
		}
		out, err := f.kubectlRun(time.Minute, "", "get", "codertemplate", k8sTemplate, "-n", faultNS, "-o", "jsonpath={.status.activeVersionID}")
		if err != nil || strings.TrimSpace(out) != tpl.ActiveVersionID.String() {
			t.Errorf("kubectl shows active version %q (%v), coderd %s", out, err, tpl.ActiveVersionID)
		}
	})
	if t.Failed() {
		return
	}

	t.Run("during a workspace start", func(t *testing.T) {
		op := f.startOperator(t, OperatorOptions{})
		f.routeAPIService(t, op)
		f.waitAccess(t)
		if out, err := f.kubectlRun(3*time.Minute, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s}
spec: {templateName: %s, running: false}
`, wsName, faultNS, tplName), "create", "-f", "-"); err != nil {
			t.Fatalf("create the workspace: %v\n%s", err, out)
		}
		f.waitCoderBuild(t, "ws-fault", codersdk.WorkspaceTransitionStop)

		f.gate.hold()
		reads := f.gate.reads()
		if out, err := f.kubectlRun(time.Minute, "", "patch", "coderworkspace", wsName, "-n", faultNS, "--type", "merge", "-p", `{"spec":{"running":true}}`); err != nil {
			t.Fatalf("start the workspace: %v\n%s", err, out)
		}
		// A user watching the workspace, and one waiting for it to be
		// Ready, both through kube-apiserver.
		watch := f.background(t, "get", "coderworkspace", wsName, "-n", faultNS, "--watch", "--output-watch-events")
		wait := f.background(t, "wait", "coderworkspace", wsName, "-n", faultNS, "--for=condition=Ready", "--timeout=4m")
		testenv.WaitFor(t, 90*time.Second, func() error {
			if f.gate.reads() == reads {
				return errNotYet("the start build has not reached the gate")
			}
			return nil
		})
		time.Sleep(time.Second)
		if watch.finished() || wait.finished() {
			t.Fatalf("kubectl returned while the start build is held:\n%s\n%s", watch.output(), wait.output())
		}
		exit := f.terminate(t, op)
		// The watch in flight ends, rather than holding the shutdown.
		watch.wait(t, gracefulShutdown)
		t.Logf("kubectl get --watch ended %s after SIGTERM: %v\n%s", watch.endedAfter(exit.signalled), watch.err, watch.output())
		f.requireReleased(t, op)
		if wait.finished() && wait.err == nil {
			t.Errorf("kubectl wait reported the workspace Ready although its build is held:\n%s", wait.output())
		}

		f.gate.release()
		f.waitCoderBuild(t, "ws-fault", codersdk.WorkspaceTransitionStart)
		w, err := f.coder.Client.WorkspaceByOwnerAndName(ctx, f.coder.Username, "ws-fault", codersdk.WorkspaceOptions{})
		if err != nil {
			t.Fatal(err)
		}

		op2 := f.startOperator(t, OperatorOptions{})
		f.routeAPIService(t, op2)
		f.waitAccess(t)
		// kubectl wait retried through the outage and sees the workspace
		// Ready once the restarted operator serves it.
		wait.wait(t, 2*time.Minute)
		if wait.err != nil {
			t.Fatalf("kubectl wait across the restart: %v\n%s", wait.err, wait.output())
		}
		t.Logf("kubectl wait across the restart ended %s after SIGTERM: %s", wait.endedAfter(exit.signalled), strings.TrimSpace(wait.output()))
		out, err := f.kubectlRun(time.Minute, "", "get", "coderworkspace", wsName, "-n", faultNS,
			"-o", "jsonpath={.spec.running} {.status.phase} {.status.latestBuild.id} {.status.latestBuild.jobStatus}")
		want := fmt.Sprintf("true %s %s %s", w.LatestBuild.Status, w.LatestBuild.ID, w.LatestBuild.Job.Status)
		if err != nil || strings.TrimSpace(out) != want {
			t.Errorf("kubectl shows %q (%v), coderd %q", out, err, want)
		}
		if out, err := f.kubectlRun(time.Minute, "", "get", "codertemplate", k8sTemplate, "-n", faultNS); err != nil {
			t.Errorf("the template is gone after the second restart: %v\n%s", err, out)
		}
	})
}

// waitCoderBuild waits until coderd's latest build of workspace name is a
// successful transition.
func (f *faultStack) waitCoderBuild(t *testing.T, name string, transition codersdk.WorkspaceTransition) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, func() error {
		w, err := f.coder.Client.WorkspaceByOwnerAndName(context.Background(), f.coder.Username, name, codersdk.WorkspaceOptions{})
		if err != nil {
			return err
		}
		b := w.LatestBuild
		if b.Transition != transition || b.Job.Status != codersdk.ProvisionerJobSucceeded {
			return fmt.Errorf("workspace %s: latest build %s %s %s", name, b.Transition, b.Job.Status, b.Job.Error)
		}
		return nil
	})
}

// exitInfo is when an operator was sent SIGTERM and how long it took to go.
type exitInfo struct {
	signalled time.Time
	took      time.Duration
}

// terminate sends SIGTERM and requires exit code 0 within the graceful
// shutdown bound.
func (f *faultStack) terminate(t *testing.T, op *Operator) exitInfo {
	t.Helper()
	e := exitInfo{signalled: time.Now()}
	// Terminate fails the test past the bound plus a little slack for a
	// loaded machine; the bound itself is checked below.
	code := op.Terminate(t, gracefulShutdown+5*time.Second)
	e.took = time.Since(e.signalled)
	t.Logf("operator exited with code %d %s after SIGTERM", code, e.took.Round(time.Millisecond))
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM; log tail:\n%s", code, op.LogTail(40))
	}
	if e.took > gracefulShutdown {
		t.Errorf("the operator took %s to stop, more than its %s bound", e.took, gracefulShutdown)
	}
	return e
}

// requireReleased checks that op left its Lease free for a successor.
func (f *faultStack) requireReleased(t *testing.T, op *Operator) {
	t.Helper()
	if h := f.leaseHolder(t, op.LeaseName); h != "" {
		t.Errorf("lease %s still held by %q after a graceful stop", op.LeaseName, h)
	}
}

// bgCommand is kubectl running in the background.
type bgCommand struct {
	done  chan struct{}
	out   testenv.LockedBuffer
	err   error
	ended time.Time
}

func (f *faultStack) background(t *testing.T, args ...string) *bgCommand {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := f.k.Kubectl(f.kubectl).Command(ctx, args...)
	b := &bgCommand{done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &b.out, &b.out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		defer close(b.done)
		defer cancel()
		b.err = cmd.Wait()
		b.ended = time.Now()
	}()
	t.Cleanup(func() {
		cancel()
		<-b.done
	})
	return b
}

func (b *bgCommand) output() string { return b.out.String() }

func (b *bgCommand) finished() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// wait fails the test unless the command ends within timeout.
func (b *bgCommand) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(timeout):
		t.Fatalf("kubectl still running %s later (a hang):\n%s", timeout, b.output())
	}
}

func (b *bgCommand) endedAfter(t0 time.Time) time.Duration {
	return b.ended.Sub(t0).Round(time.Millisecond)
}

// stateGate is a Terraform HTTP state backend on loopback. A template
// reads it with a terraform_remote_state data source in every plan (a
// template version's import, a workspace build), so the test decides when
// a build may go on: while held, reads wait.
type stateGate struct {
	srv *httptest.Server
	n   atomic.Int64

	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
}

func newStateGate(t *testing.T) *stateGate {
	t.Helper()
	g := &stateGate{open: make(chan struct{})}
	close(g.open)
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.n.Add(1)
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		select {
		case <-open:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"version":4,"terraform_version":"1.6.0","serial":1,"lineage":"coder-k8s-fault-gate","outputs":{},"resources":[]}`)
	}))
	t.Cleanup(func() {
		g.release()
		g.srv.Close()
	})
	return g
}

// template is a provider-free Terraform template whose plans read the gate.
func (g *stateGate) template() string {
	return fmt.Sprintf(`# Every plan reads this state: the test holds builds here.
data "terraform_remote_state" "gate" {
  backend = "http"
  config = {
    address = "%s/state"
  }
}

output "gate" {
  value = "passed"
}
`, g.srv.URL)
}

func (g *stateGate) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

func (g *stateGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// reads counts the reads that have arrived, held or not.
func (g *stateGate) reads() int64 { return g.n.Load() }

func ptr[T any](v T) *T { return &v }
