package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkScale.
const (
	// scaleWorkspaces is how many workspaces BenchmarkScale creates;
	// BENCH_SCALE_WORKSPACES overrides it.
	scaleWorkspaces = 10_000
	// scaleRefWorkspaces of them are built with Terraform, the way
	// BenchmarkWorkspaces builds its workspaces: the reference for the
	// seeding time of the rest, built by coderd's echo provisioner.
	scaleRefWorkspaces = 10
	// scaleDaemons is the number of coderd's built-in provisioner daemons
	// while seeding (coderd's default is 3).
	scaleDaemons = 10
	// scaleListPairs aggregated/coderd LIST pairs are timed after
	// benchListWarmup pairs.
	scaleListPairs = 12
	// scaleChanges is how many changes the watch latency figures with 50
	// watchers (the headline) and with 1 are taken over: each costs about
	// a poll interval.
	scaleChanges, scaleChanges1 = 30, 12
	// scaleWindow is the number of poll intervals coderd's requests and
	// CPU time are counted over.
	scaleWindow = 6
	// scaleColdTimeout bounds the first aggregated LIST's retries.
	scaleColdTimeout = 15 * time.Minute
	// scaleSeed seeds the offsets of the changes in the poll cycle.
	scaleSeed = 18
)

// scaleWorkspaceCount is scaleWorkspaces or BENCH_SCALE_WORKSPACES.
func scaleWorkspaceCount() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_SCALE_WORKSPACES")); err == nil && v > 0 {
		return v
	}
	return scaleWorkspaces
}

// BenchmarkScale measures the aggregated API with scaleWorkspaces real
// workspaces in a real coderd (BENCH_SCALE_WORKSPACES overrides the
// number), each figure against a reference measured in the same run:
//
//   - seeding: the workspaces are created through coderd's API, built by
//     coderd's echo provisioner with coderd's rate limits disabled;
//     reference: scaleRefWorkspaces built with Terraform as
//     BenchmarkWorkspaces builds its workspaces (time per workspace).
//     coderd is then restarted on the same database with its defaults
//     (rate limit 512 requests a minute, Terraform provisioners only), so
//     everything below runs against coderd as deployed;
//   - LIST of every coderworkspace through kube-apiserver vs coderd's own
//     GET /api/v2/workspaces for all of them in one response (coderd
//     pages only when asked to: without limit it returns every
//     workspace), same HTTP client, alternating;
//   - with 1 and with 50 watchers open, at the operator's default poll
//     interval: the time from the end of the poll that saw a change
//     (made at a random offset in the poll cycle) to its event at every
//     watcher (p50, p99), coderd requests per poll interval (counted by
//     the proxy the control plane points at) and coderd's CPU time per
//     poll interval (/proc/<pid>/stat), against coderd's CPU time with
//     no watcher open;
//   - the operator's RSS (total and anonymous) in all mode with the
//     workspaces cached (50 watchers open).
//
// Run it with:
//
//	make bench-scale   # BENCH_SCALE_WORKSPACES=1000 make bench-scale for a quick look
func BenchmarkScale(b *testing.B) {
	n := scaleWorkspaceCount()
	if n < scaleRefWorkspaces+scaleChanges+scaleChanges1 {
		b.Fatalf("BENCH_SCALE_WORKSPACES=%d: at least %d are needed", n, scaleRefWorkspaces+scaleChanges+scaleChanges1)
	}
	interval := config.Default().AggregatedAPIServer.WatchPollInterval.Duration
	st := newBenchStack(b, 0,
		withCoder(testenv.CoderOptions{
			ProvisionerTypes:   []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho},
			ProvisionerDaemons: scaleDaemons,
			DisableRateLimits:  true,
		}),
		withPollInterval(interval))
	b.ResetTimer()
	b.ReportMetric(float64(n), "workspaces")

	ids := st.seed(b, n)
	st.restartCoderDefaults(b)
	st.scaleList(b, n)

	st.pointAtProxy(b)
	idleCPU := st.coderdCPU(b, func() { time.Sleep(scaleWindow * interval) }) / scaleWindow
	b.ReportMetric(ms(idleCPU), "coderd-cpu-ms/poll-0")
	b.ReportMetric(float64(interval.Milliseconds()), "poll-interval-ms")
	fmt.Printf("coderd CPU time with no watcher open: %s per %s (over %d intervals)\n", idleCPU.Round(time.Millisecond), interval, scaleWindow)
	rnd := rand.New(rand.NewPCG(scaleSeed, 0))
	changes := ids[scaleRefWorkspaces:]
	st.scaleWatch(b, n, 1, changes[:scaleChanges1], interval, rnd, idleCPU)
	st.scaleWatch(b, n, 50, changes[scaleChanges1:][:scaleChanges], interval, rnd, idleCPU)
	b.StopTimer()
}

// seed creates workspaces 0..n-1 of the first user: the first
// scaleRefWorkspaces of a Terraform template (the reference), the rest of
// an echo template, each part 10 requests at a time and until every build
// has succeeded. It returns the workspaces by index.
func (st *benchStack) seed(b *testing.B, n int) []codersdk.Workspace {
	b.Helper()
	ctx := context.Background()
	tf, err := st.coder.PushTemplate(ctx, "scale-terraform", testenv.ProviderFreeTemplate())
	if err != nil {
		b.Fatal(err)
	}
	echo, err := st.coder.PushEchoTemplate(ctx, "scale-echo")
	if err != nil {
		b.Fatal(err)
	}
	var ws []codersdk.Workspace
	create := func(tpl codersdk.Template, from, to int) time.Duration {
		names := make([]string, to-from)
		for i := range names {
			names[i] = benchWorkspace(from + i)
		}
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
		defer cancel()
		got, err := st.coder.CreateWorkspaces(wctx, tpl, names, func(done int, elapsed time.Duration) {
			fmt.Printf("seeding: template %s: %d of %d builds done after %s\n", tpl.Name, done, len(names), elapsed.Round(time.Second))
		})
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, got...)
		return time.Since(start)
	}
	refTime := create(tf, 0, scaleRefWorkspaces)
	seedTime := create(echo, scaleRefWorkspaces, n)

	refPer := refTime / scaleRefWorkspaces
	seedPer := seedTime / time.Duration(n-scaleRefWorkspaces)
	ratio := seedPer.Seconds() / refPer.Seconds()
	b.ReportMetric(seedTime.Seconds(), "seed-s")
	b.ReportMetric(ms(seedPer), "seed-ms/workspace")
	b.ReportMetric(ms(refPer), "seed-ref-ms/workspace")
	b.ReportMetric(ratio, "seed-ratio")
	fmt.Printf("seeding ratio=%.3f: %d workspaces built by the echo provisioner in %s (%s each; %d provisioner daemons, rate limits off), reference %d built with Terraform in %s (%s each); created through coderd's API 10 at a time until every build succeeded\n",
		ratio, n-scaleRefWorkspaces, seedTime.Round(time.Second), seedPer.Round(100*time.Microsecond), scaleDaemons,
		scaleRefWorkspaces, refTime.Round(100*time.Millisecond), refPer.Round(time.Millisecond))
	return ws
}

// restartCoderDefaults restarts coderd on the same database and port with
// its default provisioner and rate-limit settings and checks that its
// rate limit is on.
func (st *benchStack) restartCoderDefaults(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	if err := st.coder.RestartServer(ctx, 15*time.Second, testenv.CoderOptions{}); err != nil {
		b.Fatal(err)
	}
	cfg, err := st.coder.Client.DeploymentConfig(ctx)
	if err != nil {
		b.Fatal(err)
	}
	rl := cfg.Values.RateLimit
	if rl.DisableAll.Value() || rl.API.Value() != 512 {
		b.Fatalf("coderd restarted with rate limits disabled=%v, API %d a minute; want coderd's default (on, 512)", rl.DisableAll.Value(), rl.API.Value())
	}
	fmt.Printf("coderd restarted with its defaults (API rate limit %d requests a minute, provisioners %s) in %s\n",
		rl.API.Value(), strings.Join(cfg.Values.Provisioner.DaemonTypes.Value(), ","), time.Since(start).Round(100*time.Millisecond))
}

// scaleList times the aggregated LIST of every coderworkspace against
// coderd's GET /api/v2/workspaces of all of them, with one client,
// alternating.
func (st *benchStack) scaleList(b *testing.B, n int) {
	b.Helper()
	agg := st.listURL
	coderd := st.coder.URL.String() + "/api/v2/workspaces"
	// The first LIST after the workspaces appeared also reads every
	// build's parameters, one request each, and may outlast
	// kube-apiserver's request timeout: the parameters read so far are
	// remembered, so it is retried.
	start := time.Now()
	var body []byte
	for attempt := 1; ; attempt++ {
		var err error
		if _, body, _, err = st.fetch(agg); err == nil {
			fmt.Printf("list: first aggregated LIST answered after %s (attempt %d)\n", time.Since(start).Round(time.Millisecond), attempt)
			break
		}
		fmt.Printf("list: first aggregated LIST, attempt %d, failed after %s: %.300s\n", attempt, time.Since(start).Round(time.Millisecond), err)
		if time.Since(start) > scaleColdTimeout {
			b.Fatalf("the aggregated LIST of %d workspaces failed for %s: %v", n, scaleColdTimeout, err)
		}
	}
	b.ReportMetric(time.Since(start).Seconds(), "list-first-s")
	st.checkItems(b, "aggregated LIST", body, "items", n)
	d, body, _, err := st.fetch(coderd)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "coderd list", body, "workspaces", n)
	fmt.Printf("list: coderd's GET /api/v2/workspaces (no limit: every workspace in one response) %s, %d KiB\n",
		d.Round(time.Millisecond), len(body)/1024)

	var as, cs []time.Duration
	for i := range benchListWarmup + scaleListPairs {
		order := []string{agg, coderd}
		if i%2 == 1 {
			order = []string{coderd, agg}
		}
		for _, u := range order {
			d, _, _, err := st.fetch(u)
			if err != nil {
				b.Fatal(err)
			}
			switch {
			case i < benchListWarmup:
			case u == agg:
				as = append(as, d)
			default:
				cs = append(cs, d)
			}
		}
	}
	aggMed, coderMed := percentile(as, 50), percentile(cs, 50)
	ratio := aggMed.Seconds() / coderMed.Seconds()
	b.ReportMetric(ratio, "list-ratio")
	b.ReportMetric(ms(aggMed), "list-ms")
	b.ReportMetric(ms(coderMed), "coderd-list-ms")
	fmt.Printf("list ratio=%.2f (target ≤ 1.15): aggregated LIST median %s, coderd GET /api/v2/workspaces median %s; %d workspaces, %d alternating pairs\n",
		ratio, aggMed.Round(100*time.Microsecond), coderMed.Round(100*time.Microsecond), n, scaleListPairs)
	st.listBreakdown(b, agg, coderd, n)
}

// pointAtProxy points the control plane at the counting proxy. The owner
// credentials are bound to coderd's own URL (annotation
// coder.com/coder-url of their Secret), so they are rebound to the proxy's
// first, as an admin moving coderd behind a proxy would.
func (st *benchStack) pointAtProxy(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	var s corev1.Secret
	if err := st.c.Get(ctx, types.NamespacedName{Namespace: benchNS, Name: ownerSecret}, &s); err != nil {
		b.Fatal(err)
	}
	patch := client.MergeFrom(s.DeepCopy())
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[coderapi.AnnotationCoderURL] = st.proxy.URL.String()
	if err := st.c.Patch(ctx, &s, patch); err != nil {
		b.Fatal(err)
	}
	st.pointAt(b, st.proxy.URL.String(), scaleColdTimeout)
}

// scaleWatch opens watchers watches, changes each workspace of changes
// (its TTL, through coderd's API) at a random offset in the poll cycle
// and times the event's arrival at every watcher after the end of the
// poll that saw it; then counts coderd's requests and CPU time over
// scaleWindow intervals, and with 50 watchers takes the operator's RSS.
func (st *benchStack) scaleWatch(b *testing.B, n, watchers int, changes []codersdk.Workspace, interval time.Duration, rnd *rand.Rand, idleCPU time.Duration) {
	b.Helper()
	ctx := context.Background()
	ws := st.startWatchers(b, watchers, st.listRV(b))
	time.Sleep(2 * interval) // the poller starts with the first watcher

	var lat latency
	for _, w := range changes {
		offset := st.sleepToRandomOffset(b, rnd, interval)
		if err := st.coder.Client.UpdateWorkspaceTTL(ctx, w.ID, codersdk.UpdateWorkspaceTTLRequest{TTLMillis: ptr(benchTTLMs)}); err != nil {
			b.Fatalf("set the TTL of %s: %v", w.Name, err)
		}
		returned := time.Now()
		ats := ws.waitAll(b, st.k8sName(w.Name), benchTTLMs, 4*interval+time.Minute)
		pollEnd := st.pollBefore(slices.MinFunc(ats, time.Time.Compare), interval)
		if pollEnd.IsZero() {
			b.Fatalf("%s: no workspace list by the operator ended before its event", w.Name)
		}
		pollStart, scrape := st.pollStartFromMetrics(b)
		lat.add(returned, ats, pollEnd, pollStart, scrape, offset)
	}

	st.midPoll(b, interval)
	before := st.proxy.Stats()
	cpu := st.coderdCPU(b, func() { time.Sleep(scaleWindow * interval) }) / scaleWindow
	window := st.proxy.Stats().Since(before)
	if watchers == 50 {
		s := st.rss(b)
		rss, anon, file := s.mib("VmRSS"), s.mib("RssAnon"), s.mib("RssFile")
		b.ReportMetric(rss, "rss-MiB")
		b.ReportMetric(anon, "rss-anon-MiB")
		b.ReportMetric(file, "rss-file-MiB")
		fmt.Printf("rss=%.1f MiB: anonymous %.1f MiB (target ≤ 160), file-backed %.1f MiB; peak (VmHWM) %.1f MiB; %d workspaces cached, %d watchers open\n",
			rss, anon, file, s.mib("VmHWM"), n, watchers)
	}
	ws.stop(b)

	perPoll := float64(window.Requests()) / scaleWindow
	p50, p99 := percentile(lat.afterPoll, 50), percentile(lat.afterPoll, 99)
	w := strconv.Itoa(watchers)
	b.ReportMetric(perPoll, "coderd-req/poll-"+w)
	b.ReportMetric(ms(cpu), "coderd-cpu-ms/poll-"+w)
	b.ReportMetric(ms(p50), "watch-"+w+"-after-poll-p50-ms")
	b.ReportMetric(ms(p99), "watch-"+w+"-after-poll-p99-ms")
	fmt.Printf("%d watchers: coderd requests/poll=%.2f (of which GET /api/v2/workspaces %.2f; over %d intervals of %s: %s; time between workspace lists %s)\n",
		watchers, perPoll, float64(window["GET /api/v2/workspaces"].Requests)/scaleWindow, scaleWindow, interval, window, st.pollGaps(before))
	fmt.Printf("%d watchers: coderd CPU time/poll=%s (%.2f× its %s with no watcher open)\n",
		watchers, cpu.Round(time.Millisecond), cpu.Seconds()/idleCPU.Seconds(), idleCPU.Round(time.Millisecond))
	fmt.Printf("%d watchers: watch latency after the poll p50=%s p99=%s (target ≤ 100ms; from coderd answering the poll that saw the change to the event at every watcher; %d changes at seeded random offsets in the poll cycle); from the change: p50 %s, max %s\n",
		watchers, p50.Round(time.Millisecond), p99.Round(time.Millisecond), len(changes),
		percentile(lat.every, 50).Round(time.Millisecond), slices.Max(lat.every).Round(time.Millisecond))
}

// coderdCPU returns the CPU time (user and system) coderd's process used
// while run ran.
func (st *benchStack) coderdCPU(b *testing.B, run func()) time.Duration {
	b.Helper()
	pid := st.coder.Process.PID()
	tick := clockTick(b)
	before, err := cpuTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	run()
	after, err := cpuTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(after-before) * tick
}

// cpuTicks is utime+stime of process pid, in clock ticks (proc(5)).
func cpuTicks(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields 14 and 15 count from after its closing one.
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return utime + stime, nil
}

// clockTick is the length of a clock tick, the unit of /proc/<pid>/stat's
// CPU times (getconf CLK_TCK: Go reads no sysconf without cgo).
func clockTick(b *testing.B) time.Duration {
	b.Helper()
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err != nil {
		b.Fatalf("getconf CLK_TCK: %v", err)
	}
	hz, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || hz <= 0 {
		b.Fatalf("getconf CLK_TCK: %q", out)
	}
	return time.Second / time.Duration(hz)
}

// ms is d in milliseconds, with fractions.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
