package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"

	"github.com/coder/coder-k8s/internal/testenv"
)

// oldestKubectl is the oldest kubectl release the aggregated API supports;
// `make tools` builds it as bin/kubectl-<oldestKubectl>.
const oldestKubectl = "1.32"

// TestOldKubectl runs the kubectl workflow of TestAggregatedAPI with the
// oldest supported kubectl against the same stack: a table, a watch seeing a
// change made in Coder, server-side apply, patch, wait, explain and delete.
// kubectl releases differ in how they list, watch and discover (table
// versions, watch-list, OpenAPI v3), so the newest kubectl passing is not
// enough.
func TestOldKubectl(t *testing.T) {
	t.Parallel()
	bin, err := testenv.Binary("kubectl-" + oldestKubectl)
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t)
	// The stack's helpers run s.kubectl; k runs them with the old binary.
	k := *s
	k.kubectl = bin
	ctx := context.Background()

	out := k.must(t, "version", "--client")
	if !strings.Contains(out, "Client Version: v"+oldestKubectl+".") {
		t.Fatalf("%s is not kubectl %s:\n%s", bin, oldestKubectl, out)
	}

	wsOld := s.seedWorkspace(t, "ws-old")

	t.Run("get -A -o wide shows the workspace Coder made", func(t *testing.T) {
		out := k.must(t, "get", "coderworkspaces", "-A", "-o", "wide")
		row := tableRow(t, out, wsOld)
		want := map[string]string{
			"NAMESPACE": s.ns, "OWNER": s.coder.Username, "TEMPLATE": "base",
			"STATUS": "running", "RUNNING": "true", "ORGANIZATION": s.org,
		}
		for col, v := range want {
			if row[col] != v {
				t.Errorf("column %s is %q, want %q:\n%s", col, row[col], v, out)
			}
		}
		for _, col := range []string{"LAST BUILT", "AGE", "VERSION"} {
			if row[col] == "" || row[col] == "<none>" {
				t.Errorf("column %s is empty:\n%s", col, out)
			}
		}
	})

	t.Run("get -w shows a stop made with the coder CLI", func(t *testing.T) {
		w := k.startKubectl(t, "get", "coderworkspaces", "-n", s.ns, "-w", "--output-watch-events")
		w.waitLine(t, 30*time.Second, "ADDED", wsOld, "running")
		start := time.Now()
		s.coderCLI(t, "stop", s.coder.Username+"/ws-old", "--yes")
		line := w.waitLine(t, 30*time.Second, "MODIFIED", wsOld, "stopped")
		// Columns: event, NAME, OWNER, TEMPLATE, STATUS, READY, AGENTS, RUNNING, ...
		if f := strings.Fields(line); len(f) < 8 || f[0] != "MODIFIED" || f[1] != wsOld || f[4] != "stopped" || f[5] != "Stopped" || f[7] != "false" {
			t.Errorf("watch event %q: want MODIFIED %s with STATUS stopped, READY Stopped and RUNNING false", line, wsOld)
		}
		t.Logf("watch event %q %s after coder stop returned", line, time.Since(start).Round(time.Millisecond))
	})

	wsApplied := s.workspaceName("ws-applied")
	t.Run("apply --server-side, patch, wait", func(t *testing.T) {
		out := k.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s}
spec:
  templateName: base
  running: false
`, wsApplied, s.ns)))
		if want := "coderworkspace.aggregation.coder.com/" + wsApplied + " serverside-applied"; !strings.Contains(out, want) {
			t.Errorf("apply printed %q, want %q", out, want)
		}
		w, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-applied", codersdk.WorkspaceOptions{})
		if err != nil {
			t.Fatalf("coderd has no workspace ws-applied: %v", err)
		}
		if w.LatestBuild.Transition != codersdk.WorkspaceTransitionStop {
			t.Errorf("latest build of a workspace applied with running: false is %s", w.LatestBuild.Transition)
		}
		out = k.must(t, "wait", "--for=jsonpath={.status.phase}=stopped", "coderworkspace/"+wsApplied, "-n", s.ns, "--timeout=90s")
		if want := "coderworkspace.aggregation.coder.com/" + wsApplied + " condition met"; !strings.Contains(out, want) {
			t.Errorf("wait printed %q, want %q", out, want)
		}

		out = k.must(t, "patch", "coderworkspace", wsApplied, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":true}}`)
		if want := "coderworkspace.aggregation.coder.com/" + wsApplied + " patched"; !strings.Contains(out, want) {
			t.Errorf("patch printed %q, want %q", out, want)
		}
		k.must(t, "wait", "--for=jsonpath={.status.phase}=running", "coderworkspace/"+wsApplied, "-n", s.ns, "--timeout=90s")
		w = s.coderWorkspace(t, "ws-applied")
		if w.LatestBuild.Transition != codersdk.WorkspaceTransitionStart || w.LatestBuild.Job.Status != codersdk.ProvisionerJobSucceeded {
			t.Errorf("coderd after patching spec.running to true: latest build %s %s", w.LatestBuild.Transition, w.LatestBuild.Job.Status)
		}
		if got := k.must(t, "get", "coderworkspace", wsApplied, "-n", s.ns, "-o", "jsonpath={.spec.running} {.status.phase}"); got != "true running" {
			t.Errorf("spec.running and status.phase after the patch: %q, want %q", got, "true running")
		}
	})

	t.Run("explain coderworkspace.spec", func(t *testing.T) {
		out := k.must(t, "explain", "coderworkspace.spec")
		for _, want := range []string{"KIND:", "CoderWorkspace", "aggregation.coder.com", "FIELDS:", "running", "<boolean>", "templateName", "ttlMillis", "parameters"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain coderworkspace.spec lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("delete --wait returns once Coder removed the workspace", func(t *testing.T) {
		out := k.must(t, "delete", "coderworkspace", wsApplied, "-n", s.ns, "--wait=true", "--timeout=120s")
		if want := "coderworkspace.aggregation.coder.com \"" + wsApplied + "\" deleted"; !strings.Contains(out, want) {
			t.Errorf("delete printed %q, want %q", out, want)
		}
		if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-applied", codersdk.WorkspaceOptions{}); err == nil {
			t.Errorf("coderd still has ws-applied after kubectl delete --wait returned")
		}
		out, err := k.run("get", "coderworkspace", wsApplied, "-n", s.ns)
		if err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("get after delete: %v\n%s", err, out)
		}
		out = k.must(t, "get", "coderworkspaces", "-n", s.ns, "-o", "name")
		if strings.Contains(out, wsApplied) || !strings.Contains(out, wsOld) {
			t.Errorf("list after delete:\n%s", out)
		}
	})
}

// tableRow returns the cells, by column header, of the row of a kubectl
// table whose NAME is name. Cells are cut at the header's column starts, so
// multi-word headers and empty cells are read correctly.
func tableRow(t *testing.T, table, name string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	header := lines[0]
	// A column starts at a non-space after two spaces or at the line start.
	var starts []int
	for i := range header {
		if header[i] != ' ' && (i == 0 || (i >= 2 && header[i-1] == ' ' && header[i-2] == ' ')) {
			starts = append(starts, i)
		}
	}
	cell := func(line string, c int) string {
		from := min(starts[c], len(line))
		to := len(line)
		if c+1 < len(starts) {
			to = min(starts[c+1], len(line))
		}
		return strings.TrimSpace(line[from:to])
	}
	nameCol := -1
	for c := range starts {
		if cell(header, c) == "NAME" {
			nameCol = c
		}
	}
	if nameCol < 0 {
		t.Fatalf("no NAME column in:\n%s", table)
	}
	for _, l := range lines[1:] {
		if cell(l, nameCol) != name {
			continue
		}
		row := map[string]string{}
		for c := range starts {
			row[cell(header, c)] = cell(l, c)
		}
		return row
	}
	t.Fatalf("no row named %s in:\n%s", name, table)
	return nil
}
