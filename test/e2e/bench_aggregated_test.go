package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/storage"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// benchWorkspaces is how many workspaces BenchmarkWorkspaces creates; BENCH_WORKSPACES overrides it (for a quick look;
// the figures are meant for 300).
const benchWorkspaces = 300

// Tunables of BenchmarkWorkspaces/Aggregated.
const (
	// benchListPairs is how many aggregated/coderd LIST pairs are timed
	// after benchListWarmup pairs.
	benchListPairs  = 25
	benchListWarmup = 3
	// benchCLIRuns is how many kubectl/coder CLI pairs are timed after one
	// warm-up pair: the two medians are within a few percent of each
	// other, about what the median of 7 runs moved from run to run.
	benchCLIRuns = 21
	// benchWatchSamples is how many changes each watch latency figure
	// (1 and 50 watchers) is taken over.
	benchWatchSamples = 30
	// benchWindow is the number of poll intervals coderd requests are
	// counted over.
	benchWindow = 10
	// benchTTLMs is the TTL of the first change: unlike any template
	// default; change k sets it k minutes longer.
	benchTTLMs   = int64((2*time.Hour + 17*time.Minute) / time.Millisecond)
	benchCCPName = "coder"
	benchNS      = "coder"
)

// benchWorkspaceCount is benchWorkspaces or BENCH_WORKSPACES.
func benchWorkspaceCount() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_WORKSPACES")); err == nil && v > 0 {
		return v
	}
	return benchWorkspaces
}

// BenchmarkWorkspaces builds one stack with benchWorkspaces real
// workspaces and runs on it, in this order, Aggregated (below), MCP
// (bench_mcp_test.go), Metadata (bench_metadata_test.go, which gives every
// workspace stored metadata, hence after the figures taken without),
// Admission (bench_admission_test.go, which restarts the operator with
// admission on and off, ending on) and
// Startup (bench_startup_test.go, which restarts the operator, hence last). BENCH_KUBE_QPS overrides the operator's
// Kubernetes client rate limit (default kubernetes.qps 50).
//
//	make bench-aggregated   # -bench '^BenchmarkWorkspaces$/^Aggregated$'
//	make bench-mcp          # -bench '^BenchmarkWorkspaces$/^MCP$'
//	make bench-metadata     # -bench '^BenchmarkWorkspaces$/^Metadata$'
//	make bench-admission    # -bench '^BenchmarkWorkspaces$/^Admission$'
//	make bench              # every benchmark, sharing this stack
func BenchmarkWorkspaces(b *testing.B) {
	n := benchWorkspaceCount()
	qps, _ := strconv.Atoi(os.Getenv("BENCH_KUBE_QPS"))
	st := newBenchStack(b, qps)
	st.createWorkspaces(b, n)
	b.Run("Aggregated", func(b *testing.B) { st.benchAggregated(b, n) })
	b.Run("MCP", func(b *testing.B) { benchMCP(b, st, n, qps) })
	b.Run("Metadata", func(b *testing.B) { st.benchMetadata(b, n) })
	b.Run("Admission", func(b *testing.B) { st.benchAdmission(b, n) })
	b.Run("Startup", st.benchStartup)
	// Last: it switches the control plane to Mapped mode and back.
	b.Run("Identity", func(b *testing.B) { st.benchIdentity(b, n) })
}

// benchAggregated measures the aggregated API on real workspaces in a
// real coderd, each figure against a reference measured in the same run:
//
//   - server side: LIST of every coderworkspace through kube-apiserver's
//     aggregation layer vs coderd's own GET /api/v2/workspaces, with the
//     same HTTP client (medians of alternating requests); then the same
//     with resourceVersion=0 (an informer's LIST, which may be served from
//     the watch cache) while one watch is open, as an informer's would be;
//   - user side: `kubectl get coderworkspaces -A -o json` vs
//     `coder list --all -o json`;
//   - watch latency from a change made with the coder CLI to its event at
//     every one of 1 and 50 watchers, and the coderd requests the operator
//     makes per poll interval meanwhile (counted by a reverse proxy the
//     CoderControlPlane points at);
//   - the resident memory of the coder-k8s process with the workspaces
//     cached.
func (st *benchStack) benchAggregated(b *testing.B, n int) {
	idle := st.rss(b)
	b.Logf("coder-k8s (pid %d) before any request for workspaces: VmRSS %.1f MiB (anonymous %.1f, file-backed %.1f)",
		st.pid, idle.mib("VmRSS"), idle.mib("RssAnon"), idle.mib("RssFile"))

	b.ResetTimer()
	st.benchList(b, n)
	st.benchCLI(b, n)
	st.benchWatch(b, n)
	b.StopTimer()

	s := st.rss(b)
	rss, anon, file := s.mib("VmRSS"), s.mib("RssAnon"), s.mib("RssFile")
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(anon, "rss-anon-MiB")
	b.ReportMetric(file, "rss-file-MiB")
	b.ReportMetric(float64(n), "workspaces")
	fmt.Printf("rss=%.1f MiB (target ≤ 80): anonymous %.1f MiB, file-backed %.1f MiB, shmem %.1f MiB; peak (VmHWM) %.1f MiB; %.1f MiB before any workspace request; %d workspaces cached\n",
		rss, anon, file, s.mib("RssShmem"), s.mib("VmHWM"), idle.mib("VmRSS"), n)
}

// benchStack is the stack of BenchmarkWorkspaces: kube-apiserver, coderd
// and coder-k8s in all mode serving aggregation.coder.com through an
// APIService, with one CoderControlPlane adopting the coderd, and a
// counting proxy in front of coderd.
type benchStack struct {
	*aggStack
	pid      int
	coderBin string
	// listURL is the aggregated LIST of every coderworkspace through
	// kube-apiserver.
	listURL string
	// hc carries the admin client certificate for kube-apiserver and the
	// first user's session token on requests to coderd.
	hc *http.Client
}

// newBenchStack starts the stack; kubeQPS, when set, overrides the
// operator's Kubernetes client rate limit; extra are further stack
// options.
func newBenchStack(b *testing.B, kubeQPS int, extra ...stackOption) *benchStack {
	b.Helper()
	coderBin, err := testenv.Binary("coder")
	if err != nil {
		b.Fatal(err)
	}
	// The control plane talks to coderd directly for the list and CLI
	// figures (a test-only hop would weigh on them); benchWatch points it
	// at the proxy.
	s := newStack(b, append([]stackOption{withCoderdProxy(false),
		// Log at info, the default: debug logging (among others a line per
		// MCP tool call) is not what a deployment pays for.
		withOperator(OperatorOptions{KubeQPS: kubeQPS, Args: []string{"--log-level", "info"}}),
		// 50 watches at once would wait for client-go's default rate limit.
		withClientRate(1000, 2000),
		// What users run: the watch latency figures depend on it.
		withPollInterval(config.Default().AggregatedAPIServer.WatchPollInterval.Duration)},
		extra...)...)
	st := &benchStack{
		aggStack: s, coderBin: coderBin,
		listURL: strings.TrimRight(s.k.Config.Host, "/") + "/apis/aggregation.coder.com/v1alpha1/coderworkspaces",
	}
	if st.pid, err = processID(st.op); err != nil {
		b.Fatal(err)
	}
	// The measurement client: one transport for both servers.
	st.hc = st.httpClient(b, s.coder.URL.Host, codersdk.SessionTokenHeader, s.coder.SessionToken)
	return st
}

// httpClient is an HTTP client with its own transport that trusts
// kube-apiserver's and the operator's CA, presents the admin client
// certificate (used only by kube-apiserver, over TLS), and sets header to
// value on requests for host only (every request when host is ""; no
// header when header is "").
func (st *benchStack) httpClient(b *testing.B, host, header, value string) *http.Client {
	return st.httpClientFor(b, st.k.Config, host, header, value)
}

// httpClientFor is httpClient presenting cfg's client certificate.
func (st *benchStack) httpClientFor(b *testing.B, cfg *rest.Config, host, header, value string) *http.Client {
	b.Helper()
	if len(cfg.CertData) == 0 && cfg.CertFile == "" {
		b.Fatal("the configuration of kube-apiserver carries no client certificate")
	}
	tr := &testenv.HeaderTransport{Next: st.transportFor(b, cfg), Host: host}
	if header != "" {
		tr.Header = http.Header{header: {value}}
	}
	return &http.Client{Timeout: 2 * time.Minute, Transport: tr}
}

// transportFor is a transport to kube-apiserver with cfg's TLS settings
// (its client certificate, if any), trusting the operator's CA too.
func (st *benchStack) transportFor(b *testing.B, cfg *rest.Config) *http.Transport {
	b.Helper()
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		b.Fatalf("TLS configuration for kube-apiserver: %v", err)
	}
	if tlsCfg == nil || tlsCfg.RootCAs == nil {
		b.Fatal("the TLS configuration for kube-apiserver has no CA pool")
	}
	// Trusting the operator's CA too lets the list breakdown call it
	// directly, bypassing kube-apiserver.
	tlsCfg.RootCAs.AppendCertsFromPEM(st.caPEM)
	tr := &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second}
	b.Cleanup(tr.CloseIdleConnections)
	return tr
}

// benchWorkspace is the Coder name of workspace i.
func benchWorkspace(i int) string { return fmt.Sprintf("bench-%03d", i) }

// k8sName is the Kubernetes name of a workspace of the first user.
func (st *benchStack) k8sName(ws string) string { return "coder." + st.coder.Username + "." + ws }

// createWorkspaces creates n workspaces of a provider-free template as the
// first user through codersdk, ten requests at a time, and waits until
// every build has succeeded. coderd builds them with its built-in
// provisioner daemons (three by default).
func (st *benchStack) createWorkspaces(b *testing.B, n int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tpl, err := st.coder.PushTemplate(ctx, "bench", testenv.ProviderFreeTemplate())
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = benchWorkspace(i)
	}
	start := time.Now()
	if _, err := st.coder.CreateWorkspaces(ctx, tpl, names, func(done int, elapsed time.Duration) {
		fmt.Printf("workspaces: %d of %d builds done after %s\n", done, n, elapsed.Round(time.Second))
	}); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("workspaces: %d created in coderd (all builds succeeded after %s)\n", n, time.Since(start).Round(time.Second))
}

// benchList times the aggregated LIST against coderd's own list.
func (st *benchStack) benchList(b *testing.B, n int) {
	agg := st.listURL
	coderd := st.coder.URL.String() + "/api/v2/workspaces"

	// The first LIST after the workspaces appeared also reads every
	// build's parameters (remembered afterwards).
	cold, body, gz, err := st.fetch(agg)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST", body, "items", n)
	fmt.Printf("list: first aggregated LIST (reads every build's parameters once) %s\n", cold.Round(time.Millisecond))
	b.Logf("kube-apiserver answered gzip-compressed: %v", gz)
	_, body, gz, err = st.fetch(coderd)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "coderd list", body, "workspaces", n)
	b.Logf("coderd answered gzip-compressed: %v", gz)

	aggMed, coderMed := st.alternate(b, agg, coderd)
	ratio := reportRatio(b, "list", aggMed, coderMed)
	fmt.Printf("list ratio=%.2f (target ≤ 1.15): aggregated LIST median %s, coderd GET /api/v2/workspaces median %s; %d workspaces, %d alternating pairs\n",
		ratio, aggMed.Round(100*time.Microsecond), coderMed.Round(100*time.Microsecond), n, benchListPairs)

	st.listBreakdown(b, agg, coderd, n)

	// resourceVersion=0 with a watch open, as an informer has.
	rv := st.listRV(b)
	ws := st.startWatchers(b, 1, rv)
	time.Sleep(2 * st.watchPollInterval()) // the poller fills the cache
	agg0 := agg + "?resourceVersion=0"
	_, body, _, err = st.fetch(agg0)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST rv=0", body, "items", n)
	agg0Med, coder0Med := st.alternate(b, agg0, coderd)
	ws.stop(b)
	ratio0 := reportRatio(b, "list-rv0", agg0Med, coder0Med)
	fmt.Printf("list rv=0 ratio=%.2f (target ≤ 0.5): aggregated LIST ?resourceVersion=0 median %s, coderd median %s; one watch open; %d alternating pairs\n",
		ratio0, agg0Med.Round(100*time.Microsecond), coder0Med.Round(100*time.Microsecond), benchListPairs)
}

// listBreakdown shows where the aggregated LIST's time goes: through
// kube-apiserver with and without response compression, and straight to
// coder-k8s (no aggregation layer), next to coderd answering all n
// workspaces at once and in the pages coder-k8s reads them in.
func (st *benchStack) listBreakdown(b *testing.B, agg, coderd string, n int) {
	direct := st.op.Aggregated + "/apis/aggregation.coder.com/v1alpha1/coderworkspaces"
	type variant struct {
		name, encoding string
		urls           []string
		times          []time.Duration
		size           int
	}
	// coder-k8s reads coderd's workspaces a page at a time, sequentially.
	var pages []string
	for offset := 0; offset < n; offset += storage.DefaultWorkspacePageSize {
		pages = append(pages, fmt.Sprintf("%s?limit=%d&offset=%d", coderd, storage.DefaultWorkspacePageSize, offset))
	}
	vs := []*variant{
		{name: "through kube-apiserver, gzip (as above)", urls: []string{agg}},
		{name: "through kube-apiserver, uncompressed", urls: []string{agg}, encoding: "identity"},
		{name: "coder-k8s directly, uncompressed", urls: []string{direct}, encoding: "identity"},
		{name: "coderd", urls: []string{coderd}},
		{name: fmt.Sprintf("coderd in pages of %d as coder-k8s reads it (%d)", storage.DefaultWorkspacePageSize, len(pages)), urls: pages},
	}
	const rounds = 15
	for i := range 2 + rounds {
		for j := range vs {
			v := vs[(i+j)%len(vs)]
			var total time.Duration
			v.size = 0
			for _, u := range v.urls {
				d, body, _, err := timedGet(st.hc, u, v.encoding)
				if err != nil {
					b.Fatal(err)
				}
				total += d
				v.size += len(body)
			}
			if i >= 2 {
				v.times = append(v.times, total)
			}
		}
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%s %s", v.name, percentile(v.times, 50).Round(100*time.Microsecond))
	}
	fmt.Printf("list breakdown (medians of %d rounds): %s; JSON %d KiB from coder-k8s, %d KiB from coderd\n",
		rounds, strings.Join(parts, ", "), vs[1].size/1024, vs[3].size/1024)
}

// alternate times GET a and GET b in alternating order and returns their
// medians.
func (st *benchStack) alternate(b *testing.B, a, c string) (time.Duration, time.Duration) {
	b.Helper()
	return alternateWith(b, st.hc, a, c)
}

// reportRatio reports the benchmark metrics <what>-ratio (aggregated ÷
// coderd), <what>-ms and coderd-<what>-ms from the two medians, and
// returns the ratio.
func reportRatio(b *testing.B, what string, aggMed, coderMed time.Duration) float64 {
	ratio := aggMed.Seconds() / coderMed.Seconds()
	b.ReportMetric(ratio, what+"-ratio")
	b.ReportMetric(float64(aggMed.Microseconds())/1000, what+"-ms")
	b.ReportMetric(float64(coderMed.Microseconds())/1000, "coderd-"+what+"-ms")
	return ratio
}

// fetch GETs url as JSON with the measurement client; see timedGet.
func (st *benchStack) fetch(url string) (time.Duration, []byte, bool, error) {
	return timedGet(st.hc, url, "")
}

// timedGet GETs url as JSON with hc and times it until the body is read;
// it also returns whether the transport decompressed the body. encoding
// is the Accept-Encoding header; "" leaves it to the transport, which asks
// for gzip and decompresses.
func timedGet(hc *http.Client, url, encoding string) (time.Duration, []byte, bool, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, false, err
	}
	req.Header.Set("Accept", "application/json")
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	return timedDo(hc, req, http.StatusOK)
}

// timedDo sends req with hc and times it until the body is read, failing
// unless the response status is one of ok; it also returns whether the
// transport decompressed the body.
func timedDo(hc *http.Client, req *http.Request, ok ...int) (time.Duration, []byte, bool, error) {
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, false, fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, nil, false, fmt.Errorf("%s %s: read body: %w", req.Method, req.URL, err)
	}
	if !slices.Contains(ok, resp.StatusCode) {
		return 0, nil, false, fmt.Errorf("%s %s: %s: %.500s", req.Method, req.URL, resp.Status, body)
	}
	return d, body, resp.Uncompressed, nil
}

// checkItems fails unless the JSON object body holds n elements in field.
func (st *benchStack) checkItems(b *testing.B, what string, body []byte, field string, n int) {
	b.Helper()
	if err := countItems(body, field, n); err != nil {
		b.Fatalf("%s: %v\noperator log:\n%s", what, err, st.op.LogTail(20))
	}
}

// countItems fails unless the JSON object body holds n elements in field.
func countItems(body []byte, field string, n int) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return fmt.Errorf("%v: %.300s", err, body)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(obj[field], &items); err != nil {
		return fmt.Errorf("%s: %v", field, err)
	}
	if len(items) != n {
		return fmt.Errorf("%d %s, want %d", len(items), field, n)
	}
	return nil
}

// benchCLI times kubectl against the coder CLI, interleaved: first in
// their default table output (what people run; the headline), then both
// with -o json.
func (st *benchStack) benchCLI(b *testing.B, n int) {
	env := st.coderEnv(b)
	kubectl := func(args ...string) func() (time.Duration, []byte, error) {
		return func() (time.Duration, []byte, error) {
			return runTimed(nil, st.kubectl, append(append(st.k.KubectlFlags(), "get", "cws", "-A"), args...)...)
		}
	}
	coderList := func(args ...string) func() (time.Duration, []byte, error) {
		return func() (time.Duration, []byte, error) {
			return runTimed(env, st.coderBin, append([]string{"list", "--all"}, args...)...)
		}
	}
	// A table is a header and a row per workspace.
	rows := func(what string) func([]byte) error {
		return func(out []byte) error {
			if lines := strings.Count(strings.TrimRight(string(out), "\n"), "\n") + 1; lines != n+1 {
				return fmt.Errorf("%s: %d lines, want a header and %d rows: %.300s", what, lines, n, out)
			}
			return nil
		}
	}

	km, cm := st.cliPair(b, kubectl(), rows("kubectl get cws -A"), coderList(), rows("coder list --all"))
	ratio := reportCLIPair(b, "", km, cm)
	fmt.Printf("kubectl ratio=%.2f (target ≤ 1.0): kubectl get cws -A median %s, coder list --all median %s (default table output of both); %d alternating runs\n",
		ratio, km.Round(time.Millisecond), cm.Round(time.Millisecond), benchCLIRuns)

	kjm, cjm := st.cliPair(b, kubectl("-o", "json"), func(out []byte) error {
		return countItems(out, "items", n)
	}, coderList("-o", "json"), func(out []byte) error {
		var arr []json.RawMessage
		if err := json.Unmarshal(out, &arr); err != nil || len(arr) != n {
			return fmt.Errorf("coder list --all -o json: %d workspaces (%v), want %d: %.300s", len(arr), err, n, out)
		}
		return nil
	})
	ratioJSON := reportCLIPair(b, "-json", kjm, cjm)
	fmt.Printf("kubectl -o json ratio=%.2f: kubectl get cws -A -o json median %s, coder list --all -o json median %s; %d alternating runs\n",
		ratioJSON, kjm.Round(time.Millisecond), cjm.Round(time.Millisecond), benchCLIRuns)
}

// reportCLIPair reports the kubectl and coder CLI medians of one output
// format (unit suffix "" for the table, "-json") and returns their ratio.
func reportCLIPair(b *testing.B, suffix string, kubectl, coder time.Duration) float64 {
	ratio := kubectl.Seconds() / coder.Seconds()
	b.ReportMetric(ratio, "kubectl"+suffix+"-ratio")
	b.ReportMetric(float64(kubectl.Milliseconds()), "kubectl"+suffix+"-ms")
	b.ReportMetric(float64(coder.Milliseconds()), "coder-cli"+suffix+"-ms")
	return ratio
}

// cliPair runs a and c alternately benchCLIRuns times each after one
// warm-up run of each (kubectl fills its discovery cache), whose output
// checkA and checkC check, and returns the medians.
func (st *benchStack) cliPair(b *testing.B, a func() (time.Duration, []byte, error), checkA func([]byte) error,
	c func() (time.Duration, []byte, error), checkC func([]byte) error) (time.Duration, time.Duration) {
	b.Helper()
	for _, w := range []struct {
		run   func() (time.Duration, []byte, error)
		check func([]byte) error
	}{{a, checkA}, {c, checkC}} {
		_, out, err := w.run()
		if err == nil {
			err = w.check(out)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	var as, cs []time.Duration
	for i := range benchCLIRuns {
		aFirst := i%2 == 0
		for j := range 2 {
			runA := (j == 0) == aFirst
			run := c
			if runA {
				run = a
			}
			d, _, err := run()
			if err != nil {
				b.Fatal(err)
			}
			if runA {
				as = append(as, d)
			} else {
				cs = append(cs, d)
			}
		}
	}
	return percentile(as, 50), percentile(cs, 50)
}

// runTimed runs a command and times it from start to exit.
func runTimed(env []string, bin string, args ...string) (time.Duration, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.Bytes())
	}
	return d, stdout.Bytes(), nil
}

// pointAt points the control plane at url (coderd or the counting proxy)
// and waits, at most within, until the aggregated API follows. Build
// parameters are remembered per coderd URL, so the first LIST through a
// new URL reads every build's parameters again: LISTs that outlast
// kube-apiserver's timeout are retried, keeping what they read.
func (st *benchStack) pointAt(b *testing.B, url string, within time.Duration) {
	b.Helper()
	ctx := context.Background()
	// The owner token is sent only to the coderd its Secret names: the
	// proxy forwards to the same coderd, so the Secret names url first.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var sec corev1.Secret
		if err := st.c.Get(ctx, types.NamespacedName{Namespace: benchNS, Name: ownerSecret}, &sec); err != nil {
			return err
		}
		if sec.Annotations == nil {
			sec.Annotations = map[string]string{}
		}
		sec.Annotations[coderapi.AnnotationCoderURL] = url
		return st.c.Update(ctx, &sec)
	})
	if err != nil {
		b.Fatal(err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ccp coderv1alpha1.CoderControlPlane
		if err := st.c.Get(ctx, types.NamespacedName{Namespace: benchNS, Name: benchCCPName}, &ccp); err != nil {
			return err
		}
		ccp.Spec.ExternalURL = url
		return st.c.Update(ctx, &ccp)
	})
	if err != nil {
		b.Fatal(err)
	}
	waitOperatorAccess(b, st.aggStack, benchNS, benchCCPName, url, 60*time.Second)
	// The aggregated server follows once its informers see the change.
	viaProxy := url == st.proxy.URL.String()
	testenv.WaitFor(b, within, func() error {
		before := st.proxy.Stats()
		if _, err := st.dyn.Resource(workspacesGVR).List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		if proxied := st.proxy.Stats().Since(before)["GET /api/v2/workspaces"].Requests > 0; proxied != viaProxy {
			return fmt.Errorf("the aggregated LIST does not follow the control plane to %s yet", url)
		}
		return nil
	})
}

// listRV lists every coderworkspace (from coderd) and returns the list's
// resourceVersion.
func (st *benchStack) listRV(b *testing.B) string {
	b.Helper()
	l, err := st.dyn.Resource(workspacesGVR).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return l.GetResourceVersion()
}

// arrival is a coderworkspace event seen by one watcher.
type arrival struct {
	watcher int
	name    string
	ttl     int64
	at      time.Time
}

// watchers are client-go watches on coderworkspaces in every namespace.
type watchers struct {
	n        int
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	arrivals chan arrival
	stopping atomic.Bool
	failed   atomic.Value // string
}

// startWatchers opens n watches through kube-apiserver from resourceVersion
// rv, as informers do after their list.
func (st *benchStack) startWatchers(b *testing.B, n int, rv string) *watchers {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ws := &watchers{n: n, cancel: cancel, arrivals: make(chan arrival, 100_000)}
	b.Cleanup(cancel)
	for i := range n {
		w, err := st.dyn.Resource(workspacesGVR).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			cancel()
			b.Fatalf("watch %d: %v", i, err)
		}
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			defer w.Stop()
			for ev := range w.ResultChan() {
				switch ev.Type {
				case watch.Added, watch.Modified:
					u, ok := ev.Object.(*unstructured.Unstructured)
					if !ok {
						continue
					}
					ttl, _, _ := unstructured.NestedInt64(u.Object, "spec", "ttlMillis")
					select {
					case ws.arrivals <- arrival{watcher: i, name: u.GetName(), ttl: ttl, at: time.Now()}:
					default:
						ws.failed.CompareAndSwap(nil, fmt.Sprintf("watcher %d: arrivals buffer full", i))
					}
				case watch.Error:
					if !ws.stopping.Load() {
						ws.failed.CompareAndSwap(nil, fmt.Sprintf("watcher %d: error event %v", i, ev.Object))
					}
				}
			}
			if !ws.stopping.Load() {
				ws.failed.CompareAndSwap(nil, fmt.Sprintf("watcher %d: the watch ended", i))
			}
		}()
	}
	return ws
}

// waitAll waits until every watcher has seen name with the given TTL and
// returns when each did.
func (ws *watchers) waitAll(b *testing.B, name string, ttl int64, timeout time.Duration) []time.Time {
	b.Helper()
	got := map[int]time.Time{}
	deadline := time.After(timeout)
	for len(got) < ws.n {
		select {
		case a := <-ws.arrivals:
			if a.name != name || a.ttl != ttl {
				continue
			}
			if _, ok := got[a.watcher]; !ok {
				got[a.watcher] = a.at
			}
		case <-deadline:
			msg, _ := ws.failed.Load().(string)
			b.Fatalf("%d of %d watchers saw the change of %s within %s %s", len(got), ws.n, name, timeout, msg)
		}
	}
	out := make([]time.Time, 0, len(got))
	for _, at := range got {
		out = append(out, at)
	}
	return out
}

// stop ends the watches, failing if one had ended or failed on its own.
func (ws *watchers) stop(b *testing.B) {
	b.Helper()
	ws.stopping.Store(true)
	ws.cancel()
	ws.wg.Wait()
	if msg, _ := ws.failed.Load().(string); msg != "" {
		b.Fatal(msg)
	}
}

// procStatus is /proc/<pid>/status's memory lines, in kB.
type procStatus map[string]int64

func (s procStatus) mib(key string) float64 { return float64(s[key]) / 1024 }

func (st *benchStack) rss(b *testing.B) procStatus {
	b.Helper()
	s, err := readProcStatus(st.pid)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// readProcStatus reads the memory lines of process pid.
func readProcStatus(pid int) (procStatus, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	s := procStatus{}
	for _, line := range strings.Split(string(raw), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(val, " kB") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(val, " kB")), 10, 64)
		if err == nil {
			s[key] = kb
		}
	}
	if s["VmRSS"] == 0 {
		return nil, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return s, nil
}

// processID finds the operator's process: testenv.Process does not expose
// its PID, but its command line names its own configuration file.
func processID(op *Operator) (int, error) {
	cfg := filepath.Join(filepath.Dir(op.LogPath), "config.yaml")
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) > 0 && args[0] == binary && slices.Contains(args, cfg) {
			return strconv.Atoi(filepath.Base(filepath.Dir(p)))
		}
	}
	return 0, fmt.Errorf("no process runs %s --config %s", binary, cfg)
}

// percentile is the p-th percentile (nearest rank) of ds; the 50th of an
// even number is the mean of the middle two, the median.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if p == 50 && len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// breakdownStep is one request of a breakdown: what it is and how to time
// it once.
type breakdownStep struct {
	name string
	f    func() (time.Duration, error)
}

// getStep times a GET of u with the bench's HTTP client.
func (st *benchStack) getStep(name, u string) breakdownStep {
	return breakdownStep{name: name, f: func() (time.Duration, error) { d, _, _, err := timedGet(st.hc, u, ""); return d, err }}
}

// printBreakdown times steps in rotating order, 2 warm-up rounds then 15
// measured, and prints each one's median as "<what> breakdown".
func printBreakdown(b *testing.B, what string, steps []breakdownStep) {
	b.Helper()
	times := make([][]time.Duration, len(steps))
	for i := range 2 + 15 {
		for j := range steps {
			k := (i + j) % len(steps)
			d, err := steps[k].f()
			if err != nil {
				b.Fatal(err)
			}
			if i >= 2 {
				times[k] = append(times[k], d)
			}
		}
	}
	parts := make([]string, len(steps))
	for i, s := range steps {
		parts[i] = fmt.Sprintf("%s %s", s.name, percentile(times[i], 50).Round(100*time.Microsecond))
	}
	fmt.Printf("%s breakdown (medians of 15 rounds): %s\n", what, strings.Join(parts, ", "))
}
