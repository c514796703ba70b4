package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"

	"github.com/coder/coder-k8s/internal/testenv"
)

// benchLogLines is how many lines the benchmarked build's local-exec
// writes: a long build log, as a real template's apply writes.
const benchLogLines = 3000

// BenchmarkBuildLog measures a read of a finished build's log through the
// log subresource, via kube-apiserver's aggregation layer, against
// coderd's own GET /api/v2/workspacebuilds/{id}/logs for the same build,
// with the same HTTP client and the same Coder user (the admin's
// certificate maps to the first user, whose token the coderd requests
// carry): medians of alternating requests after warm-ups. A finished
// build's log is remembered, so the subresource asks coderd only for the
// workspace's latest build (as the caller, which says whether they may
// see it); the breakdown times that request too.
func BenchmarkBuildLog(b *testing.B) {
	st := newBenchStack(b, 0)
	ctx := context.Background()
	if _, err := st.coder.PushTemplate(ctx, "benchlog", testenv.LogLinesTemplate(benchLogLines, 0)); err != nil {
		b.Fatal(err)
	}
	ws, err := st.coder.CreateWorkspace(ctx, "benchlog", "benchlog")
	if err != nil {
		b.Fatal(err)
	}
	build := ws.LatestBuild
	agg := strings.TrimRight(st.k.Config.Host, "/") + st.logPath("coderworkspaces", st.workspaceName("benchlog"))
	ref := st.coder.URL.String() + "/api/v2/workspacebuilds/" + build.ID.String() + "/logs"

	_, body, _, err := st.fetch(ref)
	if err != nil {
		b.Fatal(err)
	}
	var entries []codersdk.ProvisionerJobLog
	if err := json.Unmarshal(body, &entries); err != nil {
		b.Fatalf("decode coderd's build log: %v", err)
	}
	if len(entries) < benchLogLines {
		b.Fatalf("coderd's build log has %d entries, want at least %d", len(entries), benchLogLines)
	}
	want := renderJobLog(entries, build.Job, false)

	_, body, _, err = st.fetch(agg)
	if err != nil {
		b.Fatal(err)
	}
	if string(body) != want {
		b.Fatalf("the log subresource's answer (%d bytes) is not coderd's %d entries with the stage headers (%d bytes)", len(body), len(entries), len(want))
	}

	b.ResetTimer()
	aggMed, coderMed := st.alternate(b, agg, ref)
	b.StopTimer()
	ratio := reportRatio(b, "log", aggMed, coderMed)
	b.ReportMetric(float64(len(entries)), "entries")
	base := st.coder.URL.String() + "/api/v2"
	printBreakdown(b, "build log", []breakdownStep{
		st.getStep("through kube-apiserver", agg),
		st.getStep("coder-k8s directly", st.op.Aggregated+st.logPath("coderworkspaces", st.workspaceName("benchlog"))),
		st.getStep("coderd build log", ref),
		// What the subresource asks coderd once the log is remembered,
		// and what its first read asks.
		st.getStep("coderd builds of the workspace (limit 1)", base+"/workspaces/"+ws.ID.String()+"/builds?limit=1"),
		st.getStep("coderd workspace by owner and name", base+"/users/"+st.coder.Username+"/workspace/benchlog"),
	})
	fmt.Printf("build log ratio=%.2f (target ≤ 1.2): the log subresource of a build of %d entries through kube-apiserver median %s, coderd GET /api/v2/workspacebuilds/{id}/logs median %s; %d alternating pairs\n",
		ratio, len(entries), aggMed.Round(100*time.Microsecond), coderMed.Round(100*time.Microsecond), benchListPairs)
}
