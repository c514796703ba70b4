package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/testenv"
)

// coderdListEndpoint is the endpoint the poller lists workspaces with.
const coderdListEndpoint = "GET /api/v2/workspaces"

// benchWatch points the control plane at the counting proxy and measures
// watch latency and coderd load with 1 and with 50 watchers, at the
// operator's default poll interval.
//
// Each of benchWatchSamples changes sets a workspace's TTL through
// coderd's API at a random offset (math/rand/v2, seeded with
// BENCH_SEED or the clock; the seed is printed) after the start of the
// latest poll, so the changes fall anywhere in the poll cycle. Per change
// it takes, for the moment the last watcher had the event:
//
//   - after the poll (the headline): the time since coderd finished
//     answering the poll that saw the change (the end of the last
//     workspace list the counting proxy forwarded before the first
//     event; pages of one poll count as one), i.e. the operator's own
//     work from coderd's answer to the event at every watcher;
//   - after the poll started, as the operator reports it: the scrape's
//     start minus coder_k8s_poller_lag_seconds (the poller stamps a poll
//     when its list starts), so it includes coderd's answer time and
//     overstates by at most the scrape's duration;
//   - from the change: the time since coderd answered the TTL update,
//     waiting for the poll included.
//
// With the default 5 s interval it takes about 2 × (30 + 10 + 2) poll
// intervals: some 7 minutes.
func (st *benchStack) benchWatch(b *testing.B, n int) {
	interval := st.watchPollInterval()
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("BENCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	fmt.Printf("watch: changes at random offsets in the poll cycle, math/rand/v2 PCG seed %d (BENCH_SEED=%d repeats them); poll interval %s\n", seed, seed, interval)

	ids := st.workspaceIDs(b, n)
	st.pointAt(b, st.proxy.URL.String(), time.Minute)

	var lat [2]latency
	var perPoll, listsPerPoll [2]float64
	for i, watchers := range []int{1, 50} {
		ws := st.startWatchers(b, watchers, st.listRV(b))
		time.Sleep(2 * interval) // the poller starts with the first watcher

		for j := range benchWatchSamples {
			k := i*benchWatchSamples + j
			name := benchWorkspace(k % n)
			ttl := benchTTLMs + int64(k)*time.Minute.Milliseconds()
			offset := st.sleepToRandomOffset(b, rng, interval)
			err := st.coder.Client.UpdateWorkspaceTTL(context.Background(), ids[name], codersdk.UpdateWorkspaceTTLRequest{TTLMillis: &ttl})
			changed := time.Now()
			if err != nil {
				b.Fatalf("set the TTL of %s: %v", name, err)
			}
			ats := ws.waitAll(b, st.k8sName(name), ttl, 2*interval+30*time.Second)
			first := slices.MinFunc(ats, time.Time.Compare)
			pollStart, scrape := st.pollStartFromMetrics(b)
			lat[i].add(changed, ats, st.pollBefore(first, interval), pollStart, scrape, offset)
		}

		st.midPoll(b, interval)
		before := st.proxy.Stats()
		time.Sleep(benchWindow * interval)
		window := st.proxy.Stats().Since(before)
		ws.stop(b)
		perPoll[i] = float64(window.Requests()) / benchWindow
		listsPerPoll[i] = float64(window[coderdListEndpoint].Requests) / benchWindow
		b.Logf("coderd requests by coder-k8s over %d poll intervals with %d watchers: %s; time between workspace lists %s",
			benchWindow, watchers, window, st.pollGaps(before))
	}
	// What comes next (BenchmarkWorkspaces/MCP) talks to coderd directly.
	st.pointAt(b, st.coder.URL.String(), time.Minute)

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for i, watchers := range []int{1, 50} {
		l := &lat[i]
		if len(l.afterPoll) != benchWatchSamples {
			b.Fatalf("%d watchers: the poll that saw the change is known for %d of %d changes", watchers, len(l.afterPoll), benchWatchSamples)
		}
		p50, p99 := percentile(l.afterPoll, 50), percentile(l.afterPoll, 99)
		b.ReportMetric(ms(p50), fmt.Sprintf("watch-%d-after-poll-p50-ms", watchers))
		b.ReportMetric(ms(p99), fmt.Sprintf("watch-%d-after-poll-p99-ms", watchers))
		b.ReportMetric(ms(percentile(l.afterPollStart, 50)), fmt.Sprintf("watch-%d-after-poll-start-p50-ms", watchers))
		b.ReportMetric(ms(percentile(l.every, 50)), fmt.Sprintf("watch-%d-ms", watchers))
		b.ReportMetric(ms(percentile(l.every, 99)), fmt.Sprintf("watch-%d-p99-ms", watchers))
		fmt.Printf("watch latency after the poll, %d watcher(s): p50=%s p99=%s (target ≤ 100 ms; from coderd answering the poll that saw the change to the event at every watcher; %d changes, p99 = the largest; min %s)\n",
			watchers, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), benchWatchSamples,
			slices.Min(l.afterPoll).Round(100*time.Microsecond))
		fmt.Printf("watch latency after the poll started (coder_k8s_poller_lag_seconds), %d watcher(s): p50=%s p99=%s (coderd's answer included; scrape median %s)\n",
			watchers, percentile(l.afterPollStart, 50).Round(100*time.Microsecond), percentile(l.afterPollStart, 99).Round(100*time.Microsecond),
			percentile(l.scrape, 50).Round(100*time.Microsecond))
		fmt.Printf("watch latency from the change, %d watcher(s): p50=%s p99=%s (from coderd answering the TTL update to the event at every watcher, waiting for the poll included; per delivery p50 %s; change offsets after a poll started: min %s median %s max %s)\n",
			watchers, percentile(l.every, 50).Round(time.Millisecond), percentile(l.every, 99).Round(time.Millisecond),
			percentile(l.each, 50).Round(time.Millisecond),
			slices.Min(l.offsets).Round(time.Millisecond), percentile(l.offsets, 50).Round(time.Millisecond), slices.Max(l.offsets).Round(time.Millisecond))
	}
	b.ReportMetric(perPoll[0], "coderd-req/poll-1")
	b.ReportMetric(perPoll[1], "coderd-req/poll-50")
	b.ReportMetric(float64(interval.Milliseconds()), "poll-interval-ms")
	fmt.Printf("coderd requests/poll 1 watcher=%.2f 50 watchers=%.2f (target: equal; over %d intervals each; of which %s %.2f and %.2f)\n",
		perPoll[0], perPoll[1], benchWindow, coderdListEndpoint, listsPerPoll[0], listsPerPoll[1])
}

// workspaceIDs returns the IDs of the first user's workspaces by name,
// failing unless there are n.
func (st *benchStack) workspaceIDs(b *testing.B, n int) map[string]uuid.UUID {
	b.Helper()
	resp, err := st.coder.Client.Workspaces(context.Background(), codersdk.WorkspaceFilter{})
	if err != nil {
		b.Fatal(err)
	}
	ids := map[string]uuid.UUID{}
	for _, w := range resp.Workspaces {
		ids[w.Name] = w.ID
	}
	if len(ids) != n {
		b.Fatalf("coderd lists %d workspaces, want %d", len(ids), n)
	}
	return ids
}

// poll is one poll of the operator as the counting proxy saw it: its
// workspace list requests (pages) from the first's start to the last's
// end.
type poll struct{ start, end time.Time }

// polls groups the workspace lists the counting proxy forwarded into
// polls: requests that start within half an interval of the previous one
// are pages of the same poll.
func (st *benchStack) polls(interval time.Duration) []poll {
	var rs []testenv.Request
	for _, r := range st.proxy.Recent() {
		if r.Endpoint == coderdListEndpoint {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b testenv.Request) int { return a.Start.Compare(b.Start) })
	var ps []poll
	for _, r := range rs {
		if len(ps) > 0 && r.Start.Sub(ps[len(ps)-1].start) < interval/2 {
			ps[len(ps)-1].end = later(ps[len(ps)-1].end, r.End)
			continue
		}
		ps = append(ps, poll{r.Start, r.End})
	}
	return ps
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sleepToRandomOffset sleeps until a seeded random offset after the start
// of the latest poll (of the next cycle when that moment has passed) and
// returns the offset.
func (st *benchStack) sleepToRandomOffset(b *testing.B, rng *rand.Rand, interval time.Duration) time.Duration {
	b.Helper()
	offset := time.Duration(rng.Int64N(int64(interval)))
	last, ok := st.lastPollStart(interval)
	if !ok {
		b.Fatalf("the counting proxy saw no workspace list by the operator within %s of the watchers opening", 2*interval)
	}
	at := last.Add(offset)
	for at.Before(time.Now()) {
		at = at.Add(interval)
	}
	time.Sleep(time.Until(at))
	return offset
}

// lastPollStart is when the latest poll started.
func (st *benchStack) lastPollStart(interval time.Duration) (time.Time, bool) {
	ps := st.polls(interval)
	if len(ps) == 0 {
		return time.Time{}, false
	}
	return ps[len(ps)-1].start, true
}

// pollBefore returns when the last poll that ended before t ended.
func (st *benchStack) pollBefore(t time.Time, interval time.Duration) time.Time {
	var last time.Time
	for _, p := range st.polls(interval) {
		if p.end.Before(t) {
			last = later(last, p.end)
		}
	}
	return last
}

// midPoll waits until the operator's next workspace list has reached
// coderd, then half a poll interval. A window of whole intervals that
// starts there holds one list per interval, where one started at any
// moment could catch a list too few or too many at its edges (9 or 11
// over 10 intervals, though the lists came exactly one interval apart).
func (st *benchStack) midPoll(b *testing.B, interval time.Duration) {
	b.Helper()
	seen := st.proxy.Stats()[coderdListEndpoint].Requests
	for deadline := time.Now().Add(2 * interval); st.proxy.Stats()[coderdListEndpoint].Requests == seen; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("no workspace list reached coderd within %s\noperator log:\n%s", 2*interval, st.op.LogTail(20))
		}
	}
	time.Sleep(interval / 2)
}

// pollGaps lists the time between the starts of the operator's polls
// since the snapshot before was taken.
func (st *benchStack) pollGaps(before testenv.ProxyStats) string {
	var starts []time.Time
	for _, r := range st.proxy.Recent() {
		if r.Endpoint == coderdListEndpoint {
			starts = append(starts, r.Start)
		}
	}
	n := int(before[coderdListEndpoint].Requests)
	if n > len(starts) {
		return "(unknown)"
	}
	slices.SortFunc(starts, time.Time.Compare)
	var gaps []string
	for i := max(n, 1); i < len(starts); i++ {
		gaps = append(gaps, starts[i].Sub(starts[i-1]).Round(time.Millisecond).String())
	}
	return "[" + strings.Join(gaps, " ") + "]"
}

// pollStartFromMetrics returns when the operator's latest successful
// workspace poll of the control plane started by its own account: the
// scrape's start minus coder_k8s_poller_lag_seconds, hence at most the
// scrape's duration early; and the scrape's duration.
func (st *benchStack) pollStartFromMetrics(b *testing.B) (time.Time, time.Duration) {
	b.Helper()
	start := time.Now()
	families := scrapeMetrics(b, st.op.Metrics+"/metrics")
	took := time.Since(start)
	lag := seriesSum(families, "coder_k8s_poller_lag_seconds", map[string]string{"control_plane": benchNS + "/" + benchCCPName, "kind": "CoderWorkspace"})
	if lag == nil {
		b.Fatalf("no coder_k8s_poller_lag_seconds{control_plane=%q, kind=\"CoderWorkspace\"} while watches are open; the scrape has:\n%s",
			benchNS+"/"+benchCCPName, describeMetricFamily(families["coder_k8s_poller_lag_seconds"]))
	}
	return start.Add(-time.Duration(*lag * float64(time.Second))), took
}

// latency collects, per change, the time until every watcher had the
// event and of each delivery (both from the change; an event that came
// earlier counts as 0), the time from the end and from the start of the
// poll that saw the change until every watcher had it, the scrape's
// duration and the change's offset after the latest poll's start.
type latency struct {
	every, each, afterPoll, afterPollStart, scrape, offsets []time.Duration
}

func (l *latency) add(changed time.Time, arrivals []time.Time, pollEnd, pollStart time.Time, scrape, offset time.Duration) {
	last := slices.MaxFunc(arrivals, time.Time.Compare)
	l.every = append(l.every, max(last.Sub(changed), 0))
	for _, at := range arrivals {
		l.each = append(l.each, max(at.Sub(changed), 0))
	}
	if !pollEnd.IsZero() {
		l.afterPoll = append(l.afterPoll, last.Sub(pollEnd))
	}
	l.afterPollStart = append(l.afterPollStart, last.Sub(pollStart))
	l.scrape = append(l.scrape, scrape)
	l.offsets = append(l.offsets, offset)
}
