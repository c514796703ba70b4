// Command benchtable prints the summary table of the project's benchmarks
// from `go test -bench` output: each figure, its unit, the reference or
// target the benchmark states, and whether it met the target.
//
//	go run ./hack/benchtable bin/bench/bench.txt
//
// It reads the standard benchmark format: a result line is the benchmark
// name (with a -GOMAXPROCS suffix), the iteration count, then value/unit
// pairs, among them what the benchmarks report with b.ReportMetric. Other
// lines (the benchmarks' own printouts, logs) are skipped. The rows name
// those units, so the units are the benchmarks' interface with this table.
//
// `make bench` leaves out BenchmarkScale (10,000 workspaces; `make
// bench-scale`): its figures are a second table, printed when the output
// holds BenchmarkScale's results, the first when it holds any other.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtable FILE   (the output of go test -bench; - for stdin)")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(path string, w io.Writer) error {
	in := os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	res, err := parse(in)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(res) == 0 {
		return fmt.Errorf("%s holds no benchmark results", path)
	}
	var errs []error
	if slices.ContainsFunc(slices.Collect(maps.Keys(res)), func(b string) bool { return b != scale }) {
		errs = append(errs, render(w, res, rows))
	}
	if res[scale] != nil {
		if len(errs) > 0 {
			fmt.Fprintln(w)
		}
		errs = append(errs, render(w, res, scaleRows))
	}
	return errors.Join(errs...)
}

// results holds, per benchmark name without its -GOMAXPROCS suffix, each
// unit's values: one per run (go test -count).
type results map[string]map[string][]float64

// procsSuffix is the -GOMAXPROCS suffix the testing package appends to
// names when GOMAXPROCS is not 1.
var procsSuffix = regexp.MustCompile(`-[0-9]+$`)

// parse reads `go test -bench` output and returns its result lines.
func parse(r io.Reader) (results, error) {
	res := results{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		name, metrics, ok := parseLine(sc.Text())
		if !ok {
			continue
		}
		if res[name] == nil {
			res[name] = map[string][]float64{}
		}
		for unit, v := range metrics {
			res[name][unit] = append(res[name][unit], v)
		}
	}
	return res, sc.Err()
}

// parseLine parses one result line: "BenchmarkX/sub-2  1  123 ns/op  1.5 unit ...".
func parseLine(line string) (string, map[string]float64, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 || !strings.HasPrefix(f[0], "Benchmark") {
		return "", nil, false
	}
	if _, err := strconv.ParseUint(f[1], 10, 64); err != nil {
		return "", nil, false
	}
	metrics := map[string]float64{}
	for i := 2; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return "", nil, false
		}
		metrics[f[i+1]] = v
	}
	return procsSuffix.ReplaceAllString(f[0], ""), metrics, true
}

// value is the median of a benchmark's values for unit over its runs.
func (r results) value(bench, unit string) (float64, bool) {
	vs := r[bench][unit]
	if len(vs) == 0 {
		return 0, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
	}
	return s[len(s)/2], true
}

// row is one line of the table.
type row struct {
	label string
	bench string
	// unit is the b.ReportMetric unit; shown is how the table names it.
	unit, shown string
	digits      int
	// ref is the reference as text, its verbs filled with refUnits' values
	// from the same benchmark.
	ref      string
	refUnits []string
	target   target
}

// target is what a benchmark states its figure should be; the zero value
// means it states none.
type target struct {
	// atMost, when set, is the largest value that meets the target.
	atMost *float64
	// sameAs, when set, is a unit of the same benchmark the figure should
	// equal within tolerance (a fraction of it).
	sameAs    string
	tolerance float64
	// noise, when set with atMost, is a unit of the same benchmark holding
	// the run's own noise of the figure: the target is met unless the
	// figure exceeds atMost by more than that.
	noise string
	text  string
}

func atMost(v float64, text string) target { return target{atMost: &v, text: text} }

// atMostBeyondNoise is atMost(v) with the run's noise, unit noise, as
// slack.
func atMostBeyondNoise(v float64, noise, text string) target {
	return target{atMost: &v, noise: noise, text: text}
}

func sameAs(unit string, tolerance float64, text string) target {
	return target{sameAs: unit, tolerance: tolerance, text: text}
}

// met reports whether v meets t; ok is false when t cannot be checked
// (there is none, or the figure it compares with is missing).
func (t target) met(r results, bench string, v float64) (met, ok bool) {
	switch {
	case t.atMost != nil && t.noise != "":
		noise, found := r.value(bench, t.noise)
		if !found {
			return false, false
		}
		return v <= *t.atMost+noise, true
	case t.atMost != nil:
		return v <= *t.atMost, true
	case t.sameAs != "":
		other, found := r.value(bench, t.sameAs)
		if !found {
			return false, false
		}
		return math.Abs(v-other) <= t.tolerance*other, true
	}
	return false, false
}

const (
	controller = "BenchmarkController"
	aggregated = "BenchmarkWorkspaces/Aggregated"
	mcp        = "BenchmarkWorkspaces/MCP"
	metadata   = "BenchmarkWorkspaces/Metadata"
	admission  = "BenchmarkWorkspaces/Admission"
	startupCP  = "BenchmarkWorkspaces/Startup"
	identity   = "BenchmarkWorkspaces/Identity"
	tokens     = "BenchmarkTokensPerHour"
	startup    = "BenchmarkStartup"
	memory     = "BenchmarkMemory"
	promoter   = "BenchmarkPromoter"
	shared     = "BenchmarkSharedCluster"
	scale      = "BenchmarkScale"
	versions   = "BenchmarkTemplateVersions"
	users      = "BenchmarkUsers"
	buildLog   = "BenchmarkBuildLog"
	ready      = "BenchmarkWorkspaceReady"
)

// rows are the table, in order. Targets are those the benchmarks print
// next to their figures.
var rows = []row{
	{label: "controller: 100 control planes converged", bench: controller, unit: "s/100-control-planes", shown: "s", digits: 1,
		ref: "the same Deployments+Services written directly: %.1f s", refUnits: []string{"direct-writes-s"}},
	{label: "controller ratio", bench: controller, unit: "ratio", shown: "×", digits: 2,
		ref: "writing the objects directly"},
	{label: "controller steady-state writes", bench: controller, unit: "steady-writes/CR", shown: "writes/CR", digits: 2,
		target: atMost(0, "0 (goal)")},
	{label: "aggregated list ratio", bench: aggregated, unit: "list-ratio", shown: "×", digits: 2,
		ref: "coderd GET /api/v2/workspaces %.1f ms", refUnits: []string{"coderd-list-ms"}, target: atMost(1.15, "≤ 1.15")},
	{label: "aggregated list rv=0 ratio", bench: aggregated, unit: "list-rv0-ratio", shown: "×", digits: 2,
		ref: "coderd %.1f ms", refUnits: []string{"coderd-list-rv0-ms"}, target: atMost(0.5, "≤ 0.5")},
	{label: "kubectl ratio (default table output)", bench: aggregated, unit: "kubectl-ratio", shown: "×", digits: 2,
		ref: "kubectl get cws -A %.0f ms, coder list --all %.0f ms", refUnits: []string{"kubectl-ms", "coder-cli-ms"}, target: atMost(1.0, "≤ 1.0")},
	{label: "kubectl ratio, -o json", bench: aggregated, unit: "kubectl-json-ratio", shown: "×", digits: 2,
		ref: "coder list --all -o json %.0f ms", refUnits: []string{"coder-cli-json-ms"}},
	{label: "watch latency after the poll, 1 watcher, p50", bench: aggregated, unit: "watch-1-after-poll-p50-ms", shown: "ms", digits: 1,
		ref: "from coderd answering the poll that saw the change", target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 1 watcher, p99", bench: aggregated, unit: "watch-1-after-poll-p99-ms", shown: "ms", digits: 1,
		target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 50 watchers, p50", bench: aggregated, unit: "watch-50-after-poll-p50-ms", shown: "ms", digits: 1,
		ref: "to the event at every watcher", target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 50 watchers, p99", bench: aggregated, unit: "watch-50-after-poll-p99-ms", shown: "ms", digits: 1,
		target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll started, 1 watcher, p50", bench: aggregated, unit: "watch-1-after-poll-start-p50-ms", shown: "ms", digits: 1,
		ref: "coderd's answer included (coder_k8s_poller_lag_seconds)"},
	{label: "watch latency after the poll started, 50 watchers, p50", bench: aggregated, unit: "watch-50-after-poll-start-p50-ms", shown: "ms", digits: 1,
		ref: "coderd's answer included (coder_k8s_poller_lag_seconds)"},
	{label: "watch latency from the change, 1 watcher, p50", bench: aggregated, unit: "watch-1-ms", shown: "ms", digits: 0,
		ref: "poll interval %.0f ms", refUnits: []string{"poll-interval-ms"}},
	{label: "watch latency from the change, 1 watcher, p99", bench: aggregated, unit: "watch-1-p99-ms", shown: "ms", digits: 0,
		ref: "poll interval %.0f ms", refUnits: []string{"poll-interval-ms"}},
	{label: "watch latency from the change, 50 watchers, p50", bench: aggregated, unit: "watch-50-ms", shown: "ms", digits: 0,
		ref: "poll interval %.0f ms", refUnits: []string{"poll-interval-ms"}},
	{label: "watch latency from the change, 50 watchers, p99", bench: aggregated, unit: "watch-50-p99-ms", shown: "ms", digits: 0,
		ref: "poll interval %.0f ms", refUnits: []string{"poll-interval-ms"}},
	{label: "coderd requests per poll, 1 watcher", bench: aggregated, unit: "coderd-req/poll-1", shown: "req/poll", digits: 2},
	{label: "coderd requests per poll, 50 watchers", bench: aggregated, unit: "coderd-req/poll-50", shown: "req/poll", digits: 2,
		target: sameAs("coderd-req/poll-1", 0.1, "equal to 1 watcher's (±10%)")},
	{label: "MCP ratio (watch cache fresh)", bench: mcp, unit: "mcp-ratio", shown: "×", digits: 2,
		ref: "aggregated LIST ?resourceVersion=0, a watch open, %.1f ms", refUnits: []string{"list-ms"}, target: atMost(1.3, "≤ 1.3")},
	{label: "MCP ratio, cold (watch cache stale)", bench: mcp, unit: "mcp-cold-ratio", shown: "×", digits: 2,
		ref: "aggregated LIST (reads coderd) after the same pause %.1f ms", refUnits: []string{"list-coderd-ms"}, target: atMost(1.3, "≤ 1.3")},
	{label: "MCP tool calls/s, 10 clients", bench: mcp, unit: "calls/s", shown: "calls/s", digits: 1,
		ref: "aggregated LIST ?resourceVersion=0, 10 clients: %.1f/s", refUnits: []string{"ref-list/s"}},
	{label: "template apply ratio (kubectl apply --server-side)", bench: metadata, unit: "apply-ratio", shown: "×", digits: 2,
		ref: "ConfigMap of the same files %.0f ms", refUnits: []string{"configmap-apply-ms"}, target: atMost(1.5, "≤ 1.5")},
	{label: "template apply ratio, settings and variables changed (files not)", bench: metadata, unit: "settings-apply-ratio", shown: "×", digits: 2,
		ref: "ConfigMap of the same data %.0f ms", refUnits: []string{"configmap-settings-apply-ms"}, target: atMost(1.5, "≤ 1.5")},
	{label: "label change to an open watch, p50", bench: metadata, unit: "meta-watch-p50-ms", shown: "ms", digits: 0,
		target: atMost(1000, "≤ 1000")},
	{label: "label change to an open watch, p99", bench: metadata, unit: "meta-watch-p99-ms", shown: "ms", digits: 0,
		target: atMost(1000, "≤ 1000")},
	{label: "aggregated list ratio, every workspace with stored metadata", bench: metadata, unit: "list-meta-ratio", shown: "×", digits: 2,
		ref: "same run without metadata %.2f×", refUnits: []string{"list-plain-ratio"},
		target: sameAs("list-plain-ratio", 0.1, "equal to the ratio without (±10%)")},
	{label: "aggregated list ratio, admission on (1 policy bound) / off", bench: admission, unit: "list-ratio", shown: "×", digits: 3,
		ref: "on %.1f ms, off %.1f ms; noise ±%.3f", refUnits: []string{"list-on-ms", "list-off-ms", "list-noise"},
		target: atMostBeyondNoise(1.05, "list-noise", "≤ 1.05 beyond noise")},
	{label: "template apply ratio, admission on (1 policy bound) / off", bench: admission, unit: "apply-ratio", shown: "×", digits: 3,
		ref: "on %.0f ms, off %.0f ms; noise ±%.3f", refUnits: []string{"apply-on-ms", "apply-off-ms", "apply-noise"},
		target: atMostBeyondNoise(1.05, "apply-noise", "≤ 1.05 beyond noise")},
	{label: "RSS ratio, admission on (1 policy bound) / off", bench: admission, unit: "rss-ratio", shown: "×", digits: 3,
		ref: "on %.1f MiB, off %.1f MiB; noise ±%.3f", refUnits: []string{"rss-on-MiB", "rss-off-MiB", "rss-noise"},
		target: atMostBeyondNoise(1.10, "rss-noise", "≤ 1.10 beyond noise")},
	{label: "LIST of 300 codertemplateversions ratio", bench: versions, unit: "list-ratio", shown: "×", digits: 2,
		ref: "coderd's versions lists of the same templates %.1f ms", refUnits: []string{"coderd-list-ms"}, target: atMost(1.2, "≤ 1.2")},
	{label: "LIST of 1,000 coderusers ratio", bench: users, unit: "list-ratio", shown: "×", digits: 2,
		ref: "coderd GET /api/v2/users of the same users %.1f ms", refUnits: []string{"coderd-list-ms"}, target: atMost(1.2, "≤ 1.2")},
	{label: "build log of 3,000 lines ratio", bench: buildLog, unit: "log-ratio", shown: "×", digits: 2,
		ref: "coderd GET /api/v2/workspacebuilds/{id}/logs of the same build %.1f ms", refUnits: []string{"coderd-log-ms"}, target: atMost(1.2, "≤ 1.2")},
	{label: "workspace ready ratio: kubectl create → Ready=True ÷ coder create → agent ready", bench: ready, unit: "ready-ratio", shown: "×", digits: 2,
		ref: "medians of %.0f pairs: kubectl %.2f s, coder CLI %.2f s", refUnits: []string{"pairs", "kubectl-ready-s", "coder-ready-s"}, target: atMost(1.1, "≤ 1.1")},
	{label: "member's list of 10 workspaces among 310 (Mapped mode)", bench: identity, unit: "member-list-ratio", shown: "×", digits: 2,
		ref: "coderd GET /api/v2/workspaces with the member's token %.1f ms", refUnits: []string{"coderd-member-list-ms"}, target: atMost(1.2, "≤ 1.2")},
	{label: "coderd list requests per poll, 50 users watching (Mapped mode)", bench: identity, unit: "lists-per-poll-50-users", shown: "/poll", digits: 2,
		ref: "1 user watching: %.2f", refUnits: []string{"lists-per-poll-1-user"}, target: sameAs("lists-per-poll-1-user", 0, "equal to 1 user's")},
	{label: "tokens minted per user per hour of steady use", bench: tokens, unit: "tokens/user/h", shown: "", digits: 2,
		ref: "6 simulated hours, a call every 5 minutes", target: atMost(2, "≤ 2")},
	{label: "template promotion delay, 20 builds hung in another coderd, median", bench: promoter, unit: "promote-hung-ratio", shown: "× poll interval", digits: 2,
		ref: "no hung builds %.2f; poll interval %.0f ms", refUnits: []string{"promote-ref-ratio", "poll-interval-ms"}, target: atMost(1, "≤ 1")},
	// The longest wait for a poll is one interval, plus the promotion's
	// own calls: the worst case can exceed 1 without a hung coderd.
	{label: "template promotion delay, 20 builds hung in another coderd, max", bench: promoter, unit: "promote-hung-max-ratio", shown: "× poll interval", digits: 2,
		ref: "no hung builds %.2f", refUnits: []string{"promote-ref-max-ratio"}},
	{label: "all-namespaces list, 1 of 2 coderds hung (cluster controller)", bench: shared, unit: "hung-list-ratio", shown: "×", digits: 2,
		ref: "both up %.1f ms, hung %.1f ms, %.0f workspaces", refUnits: []string{"list-ms", "hung-list-ms", "workspaces"}, target: atMost(1.2, "≤ 1.2")},
	{label: "first all-namespaces list after a coderd hung (learns that it fails)", bench: shared, unit: "hung-detect-s", shown: "s", digits: 1,
		ref: "waits for coderd's request timeout (default 30 s)"},
	{label: "all-namespaces list, 1 of 2 coderds hung (Coder owner, Mapped mode)", bench: shared, unit: "owner-hung-list-ratio", shown: "×", digits: 2,
		ref: "both up %.1f ms, hung %.1f ms", refUnits: []string{"owner-list-ms", "owner-hung-list-ms"}},
	{label: "workspaces missing from that list (Coder owner, Mapped mode)", bench: shared, unit: "owner-hung-missing", shown: "", digits: 0,
		ref: "of %.0f", refUnits: []string{"workspaces"}, target: atMost(0, "0")},
	{label: "authorization checks for a member's new watch of 300 templates (Mapped mode)", bench: shared, unit: "watch-authchecks", shown: "requests", digits: 0,
		ref: "ceil(%.0f/10) = %.0f", refUnits: []string{"templates", "authcheck-least"}, target: atMost(31, "≤ 31")},
	{label: "authorization checks ratio, per ceil(templates/10)", bench: shared, unit: "watch-authcheck-ratio", shown: "×", digits: 2,
		ref: "coderd answers 10 resource IDs per request"},
	{label: "RSS idle, no control plane", bench: startup, unit: "rss-idle-MiB", shown: "MiB", digits: 1},
	{label: "RSS idle, control plane with workspaces", bench: startupCP, unit: "rss-idle-MiB", shown: "MiB", digits: 1},
	{label: "RSS loaded, workspaces cached", bench: aggregated, unit: "rss-MiB", shown: "MiB", digits: 1,
		ref: "%.0f workspaces cached", refUnits: []string{"workspaces"}, target: atMost(80, "≤ 80 at 300 workspaces")},
	{label: "RSS idle, empty cluster", bench: memory, unit: "rss-empty-MiB", shown: "MiB", digits: 1},
	{label: "RSS idle, 5,000 unrelated Secrets+Deployments+ConfigMaps", bench: memory, unit: "rss-loaded-MiB", shown: "MiB", digits: 1,
		ref: "empty cluster %.1f MiB", refUnits: []string{"rss-empty-MiB"}},
	{label: "RSS ratio, unrelated objects / empty", bench: memory, unit: "rss-ratio", shown: "×", digits: 3,
		ref: "empty cluster", target: atMost(1.10, "≤ 1.10")},
	{label: "start-to-ready, no control plane", bench: startup, unit: "ready-s", shown: "s", digits: 2,
		ref: "kubectl get --raw /readyz %.2f s", refUnits: []string{"ref-kubectl-s"}, target: atMost(5, "≤ 5 s (the chart's readiness probe period)")},
	{label: "start-to-ready ratio, no control plane", bench: startup, unit: "ready-ratio", shown: "×", digits: 1,
		ref: "kubectl get --raw /readyz"},
	{label: "start-to-ready, control plane with workspaces", bench: startupCP, unit: "ready-s", shown: "s", digits: 2,
		ref: "kubectl get --raw /readyz %.2f s", refUnits: []string{"ref-kubectl-s"}, target: atMost(5, "≤ 5 s (the chart's readiness probe period)")},
}

// scaleRows are BenchmarkScale's table (`make bench-scale`).
var scaleRows = []row{
	{label: "workspaces", bench: scale, unit: "workspaces", shown: "", digits: 0},
	{label: "seeding, echo provisioner, per workspace", bench: scale, unit: "seed-ms/workspace", shown: "ms", digits: 1,
		ref: "Terraform (as BenchmarkWorkspaces builds) %.0f ms", refUnits: []string{"seed-ref-ms/workspace"}},
	{label: "seeding ratio", bench: scale, unit: "seed-ratio", shown: "×", digits: 3,
		ref: "Terraform per workspace"},
	{label: "seeding time, every workspace", bench: scale, unit: "seed-s", shown: "s", digits: 0},
	{label: "first aggregated LIST (reads every build's parameters)", bench: scale, unit: "list-first-s", shown: "s", digits: 1},
	{label: "aggregated list ratio", bench: scale, unit: "list-ratio", shown: "×", digits: 2,
		ref: "coderd GET /api/v2/workspaces %.1f ms", refUnits: []string{"coderd-list-ms"}, target: atMost(1.15, "≤ 1.15")},
	{label: "RSS, workspaces cached", bench: scale, unit: "rss-MiB", shown: "MiB", digits: 1},
	{label: "RSS anonymous, workspaces cached", bench: scale, unit: "rss-anon-MiB", shown: "MiB", digits: 1,
		target: atMost(160, "≤ 160")},
	{label: "coderd requests per poll, 1 watcher", bench: scale, unit: "coderd-req/poll-1", shown: "req/poll", digits: 2,
		ref: "poll interval %.0f ms", refUnits: []string{"poll-interval-ms"}},
	{label: "coderd requests per poll, 50 watchers", bench: scale, unit: "coderd-req/poll-50", shown: "req/poll", digits: 2,
		target: sameAs("coderd-req/poll-1", 0.1, "equal to 1 watcher's (±10%)")},
	{label: "coderd CPU per poll, 1 watcher", bench: scale, unit: "coderd-cpu-ms/poll-1", shown: "ms", digits: 0,
		ref: "no watcher %.0f ms", refUnits: []string{"coderd-cpu-ms/poll-0"}},
	{label: "coderd CPU per poll, 50 watchers", bench: scale, unit: "coderd-cpu-ms/poll-50", shown: "ms", digits: 0,
		ref: "no watcher %.0f ms", refUnits: []string{"coderd-cpu-ms/poll-0"}},
	{label: "watch latency after the poll, 1 watcher, p50", bench: scale, unit: "watch-1-after-poll-p50-ms", shown: "ms", digits: 0,
		target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 1 watcher, p99", bench: scale, unit: "watch-1-after-poll-p99-ms", shown: "ms", digits: 0,
		target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 50 watchers, p50", bench: scale, unit: "watch-50-after-poll-p50-ms", shown: "ms", digits: 0,
		target: atMost(100, "≤ 100")},
	{label: "watch latency after the poll, 50 watchers, p99", bench: scale, unit: "watch-50-after-poll-p99-ms", shown: "ms", digits: 0,
		target: atMost(100, "≤ 100")},
}

// errMissing is returned by render when a row's figure is not in the
// results; the table is printed anyway.
var errMissing = errors.New("some figures were not measured")

// render writes the table as Markdown with aligned columns.
func render(w io.Writer, r results, rows []row) error {
	table := [][]string{{"figure", "value", "unit", "reference / target", "met"}}
	missing := false
	for _, row := range rows {
		v, ok := r.value(row.bench, row.unit)
		if !ok {
			missing = true
			table = append(table, []string{row.label, "not measured", row.shown, row.bench + " " + row.unit, ""})
			continue
		}
		var ref []string
		if row.ref != "" {
			args := make([]any, len(row.refUnits))
			for i, u := range row.refUnits {
				rv, ok := r.value(row.bench, u)
				if !ok {
					rv = math.NaN()
				}
				args[i] = rv
			}
			ref = append(ref, fmt.Sprintf(row.ref, args...))
		}
		met := "—"
		if row.target.text != "" {
			ref = append(ref, "target "+row.target.text)
			switch m, ok := row.target.met(r, row.bench, v); {
			case !ok:
				met = "?"
			case m:
				met = "yes"
			default:
				met = "NO"
			}
		}
		table = append(table, []string{row.label, strconv.FormatFloat(v, 'f', row.digits, 64), row.shown, strings.Join(ref, "; "), met})
	}

	widths := make([]int, len(table[0]))
	for _, cells := range table {
		for i, c := range cells {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if i == 1 { // numbers right-aligned
				c = pad + c
			} else {
				c += pad
			}
			b.WriteString("| " + c + " ")
		}
		fmt.Fprintln(w, b.String()+"|")
	}
	line(table[0])
	sep := make([]string, len(widths))
	for i, n := range widths {
		sep[i] = strings.Repeat("-", n)
	}
	fmt.Fprintln(w, "|-"+strings.Join(sep, "-|-")+"-|")
	for _, cells := range table[1:] {
		line(cells)
	}
	if missing {
		return errMissing
	}
	return nil
}
