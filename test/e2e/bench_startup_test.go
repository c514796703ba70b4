package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of the startup benchmarks. BENCH_STARTUP_ROUNDS overrides
// startupRounds.
const (
	// startupRounds is how many times the binary is started; the figures
	// are medians over them.
	startupRounds = 5
	// startupIdle is how long the process runs ready and without requests
	// before its resident memory is read.
	startupIdle = 5 * time.Second
	// startupTarget is the chart's readiness probe period
	// (readinessProbe: initialDelaySeconds 0, periodSeconds 5): ready
	// within it, a new replica is Ready at its second probe at the latest.
	startupTarget = 5 * time.Second
	// startupPoll is how often the log file and the /readyz endpoints are
	// checked while the process starts.
	startupPoll = 10 * time.Millisecond
)

// BenchmarkStartup measures the coder-k8s binary in all mode against the
// real kube-apiserver with no CoderControlPlane (BenchmarkWorkspaces/Startup
// does the same with one, adopting a coderd with 300 workspaces).
//
// Start-to-ready is the time from starting the process until /readyz
// answers 200 on every component (the controller's health port, the
// aggregated API server, the MCP server), with the chart's default TLS
// mode (autoTLS: the serving certificate kept in a Secret; the first start
// creates it, later ones, like a restart or another replica, read it).
//
// The reference, measured in the same run alternating with the starts, is
// `kubectl get --raw /readyz` from exec to exit: what any client-go program
// pays here before it has one answer from this kube-apiserver (exec,
// runtime start, kubeconfig, TLS handshake, one request). ready-ratio thus
// says how many of those the operator's own work costs (filling its
// caches, reading the client CA ConfigMap and its certificate Secret,
// starting three servers), on this machine under its current load. The
// first line the binary logs (once it has loaded its configuration) shows
// its fixed start cost.
//
// RSS idle is VmRSS startupIdle after ready, with no requests.
//
//	make bench   # or: go test ./test/e2e -run '^$' -bench '^BenchmarkStartup$' -benchtime 1x
func BenchmarkStartup(b *testing.B) {
	k := testenv.NewKubeAPI(b, testenv.KubeAPIOptions{})
	b.ResetTimer()
	measureStartup(b, k, "no control plane")
}

// benchStartup restarts the stack's operator with the configuration of
// BenchmarkStartup, now with a CoderControlPlane adopting a coderd with
// the workspaces. It stops the stack's operator for good (two controllers
// would reconcile the same control plane), so BenchmarkWorkspaces runs it
// last.
func (st *benchStack) benchStartup(b *testing.B) {
	st.op.Stop(30 * time.Second)
	b.ResetTimer()
	measureStartup(b, st.k, "a control plane, "+strconv.Itoa(benchWorkspaceCount())+" workspaces in its coderd")
}

// startupSample is one start of the binary, each time from just before the
// process was started.
type startupSample struct {
	firstLog time.Duration
	// ready is when each of startupEndpoints first answered 200.
	ready []time.Duration
	rss   procStatus
}

// last is when the last component became ready: the process's
// start-to-ready.
func (s startupSample) last() time.Duration { return slices.Max(s.ready) }

// startupEndpoints are the /readyz URLs of every component in all mode.
func startupEndpoints(op *Operator) []string {
	return []string{op.Health + "/readyz", op.Aggregated + "/readyz", op.MCP + "/readyz"}
}

var startupComponents = []string{"controller", "aggregated API", "MCP"}

func startupRoundCount() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_STARTUP_ROUNDS")); err == nil && v > 0 {
		return v
	}
	return startupRounds
}

// measureStartup starts the binary in all mode against k startupRounds
// times, alternating with the kubectl reference, and reports the medians.
func measureStartup(b *testing.B, k *testenv.KubeAPI, what string) {
	b.Helper()
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// autoTLS keeps its Secret and writes its CA into the APIService
	// there, as the chart sets it up.
	if err := k.EnsureNamespace(ctx, aggServiceNamespace); err != nil {
		b.Fatal(err)
	}
	reference := func() time.Duration {
		d, out, err := runTimed(nil, kubectl, append(k.KubectlFlags(), "get", "--raw", "/readyz")...)
		if err != nil {
			b.Fatal(err)
		}
		if string(out) != "ok" {
			b.Fatalf("kubectl get --raw /readyz: %q, want ok", out)
		}
		return d
	}
	reference() // warm-up: kubectl's pages in the page cache
	first := "the first"
	secret := config.Default().AggregatedAPIServer.AutoTLS.SecretName
	if _, err := k.Clientset.CoreV1().Secrets(aggServiceNamespace).Get(ctx, secret, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		first = "the first, which created the autoTLS Secret,"
	} else if err != nil {
		b.Fatal(err)
	}

	rounds := startupRoundCount()
	var refs []time.Duration
	samples := make([]startupSample, 0, rounds)
	for range rounds {
		refs = append(refs, reference())
		samples = append(samples, startOnce(b, k))
	}

	pick := func(f func(startupSample) time.Duration) []time.Duration {
		ds := make([]time.Duration, len(samples))
		for i, s := range samples {
			ds[i] = f(s)
		}
		return ds
	}
	ready := pick(startupSample.last)
	readyMed, refMed := percentile(ready, 50), percentile(refs, 50)
	logMed := percentile(pick(func(s startupSample) time.Duration { return s.firstLog }), 50)
	parts := make([]string, len(startupComponents))
	for i, c := range startupComponents {
		parts[i] = fmt.Sprintf("%s %s", c, percentile(pick(func(s startupSample) time.Duration { return s.ready[i] }), 50).Round(time.Millisecond))
	}
	var rss, anon, file []float64
	for _, s := range samples {
		rss, anon, file = append(rss, s.rss.mib("VmRSS")), append(anon, s.rss.mib("RssAnon")), append(file, s.rss.mib("RssFile"))
	}
	ratio := readyMed.Seconds() / refMed.Seconds()

	b.ReportMetric(readyMed.Seconds(), "ready-s")
	b.ReportMetric(logMed.Seconds(), "first-log-s")
	b.ReportMetric(refMed.Seconds(), "ref-kubectl-s")
	b.ReportMetric(ratio, "ready-ratio")
	b.ReportMetric(median(rss), "rss-idle-MiB")
	fmt.Printf("startup (%s): ready=%s (target ≤ %s, the chart's readiness probe period): median over %d starts in all mode of the time from process start until /readyz answers 200 on every component (medians: %s; slowest start %s, %s %s); first log line %s; reference `kubectl get --raw /readyz` median %s; ratio=%.1f\n",
		what, readyMed.Round(time.Millisecond), startupTarget, rounds, strings.Join(parts, ", "), slices.Max(ready).Round(time.Millisecond),
		first, ready[0].Round(time.Millisecond), logMed.Round(time.Millisecond), refMed.Round(time.Millisecond), ratio)
	fmt.Printf("startup (%s): rss idle=%.1f MiB (median VmRSS %s after ready with no requests: anonymous %.1f MiB, file-backed %.1f MiB)\n",
		what, median(rss), startupIdle, median(anon), median(file))
}

// startOnce starts the binary, waits until every component is ready,
// reads its memory after startupIdle and stops it.
func startOnce(b *testing.B, k *testenv.KubeAPI) startupSample {
	b.Helper()
	autoTLS := fmt.Sprintf("autoTLS: {enabled: true, namespace: %s, serviceName: %s, apiServiceName: v1alpha1.aggregation.coder.com}",
		aggServiceNamespace, aggServiceName)
	// Info, the default level: what a deployment logs.
	op := StartOperator(b, OperatorOptions{Mode: "all", Kubeconfig: k.KubeconfigPath, Aggregated: autoTLS, Args: []string{"--log-level", "info"}})
	defer op.Stop(30 * time.Second)
	// Timed from the exec of the binary: the test's own setup before it
	// (the chart's RBAC rendered and applied, the config file) is not the
	// binary's start.
	start := op.Started

	urls := startupEndpoints(op)
	s := startupSample{ready: make([]time.Duration, len(urls))}
	deadline := start.Add(2 * time.Minute)
	for {
		if s.firstLog == 0 {
			if fi, err := os.Stat(op.LogPath); err == nil && fi.Size() > 0 {
				s.firstLog = time.Since(start)
			}
		}
		pending := s.firstLog == 0
		for i, u := range urls {
			if s.ready[i] != 0 {
				continue
			}
			if readyzOK(u) {
				s.ready[i] = time.Since(start)
			} else {
				pending = true
			}
		}
		if !pending {
			break
		}
		if exited, err := op.Exited(); exited {
			b.Fatalf("coder-k8s exited while starting (%v); log tail:\n%s", err, op.LogTail(30))
		}
		if time.Now().After(deadline) {
			b.Fatalf("coder-k8s not ready after %s (ready after %v of %v); log tail:\n%s", deadline.Sub(start), s.ready, startupComponents, op.LogTail(30))
		}
		time.Sleep(startupPoll)
	}

	time.Sleep(startupIdle)
	pid, err := processID(op)
	if err != nil {
		b.Fatal(err)
	}
	if s.rss, err = readProcStatus(pid); err != nil {
		b.Fatal(err)
	}
	return s
}

// readyzOK reports whether GET url answers 200 within a second.
func readyzOK(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	code, _, err := get(ctx, url)
	return err == nil && code == http.StatusOK
}

func median(fs []float64) float64 {
	if len(fs) == 0 {
		return 0
	}
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
