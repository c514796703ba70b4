package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// Tunables of BenchmarkWorkspaces/Metadata.
const (
	// benchApplyRuns is how many template/ConfigMap apply pairs are timed
	// after one warm-up pair (the creates).
	benchApplyRuns = 7
	// benchMetaChanges is how many label changes the watch latency is
	// taken over.
	benchMetaChanges = 12
	// benchMetaLabel is the label the benchmark sets.
	benchMetaLabel = "example.com/bench"
)

// benchMetadata measures what durable metadata costs, each figure against
// a reference measured in the same run:
//
//   - `kubectl apply --server-side` of a CoderTemplate whose files change
//     on every apply (a new template version) vs the same apply of a
//     ConfigMap holding the same files, from exec to exit, medians of
//     alternating runs. The apply returns once the version is uploaded
//     and queued; it does not wait for the build.
//   - the time from sending a label change of a workspace (the merge
//     patch kubectl label sends) to the MODIFIED event carrying the new
//     label at an open watch (p50 and p99 over benchMetaChanges changes;
//     timed from the request's start because the write publishes the
//     event before it answers, so it usually arrives before the PATCH
//     returns).
//   - the aggregated LIST ratio (vs coderd's own list, as in
//     benchAggregated) before and after every workspace got a label and an
//     annotation (so every object has a stored record).
func (st *benchStack) benchMetadata(b *testing.B, n int) {
	if n < benchMetaChanges {
		b.Fatalf("the label changes need %d workspaces, there are %d", benchMetaChanges, n)
	}
	agg := st.listURL
	coderd := st.coder.URL.String() + "/api/v2/workspaces"
	b.ResetTimer()

	// The reference: the list ratio of this run before any record exists.
	_, plainBody, _, err := timedGet(st.hc, agg, "identity")
	if err != nil {
		b.Fatal(err)
	}
	plainAgg, plainCoderd := st.alternate(b, agg, coderd)
	plain := plainAgg.Seconds() / plainCoderd.Seconds()

	st.benchTemplateApply(b)
	st.benchTemplateSettingsApply(b)
	st.benchMetaWatch(b)

	// A label and an annotation on every workspace, written through the
	// aggregated API as kubectl label would.
	start := time.Now()
	parallel(n, func(i int) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"all"},"annotations":{"example.com/bench-note":"workspace %d of the metadata benchmark"}}}`, benchMetaLabel, i)
		_, err := st.dyn.Resource(workspacesGVR).Namespace(benchNS).Patch(context.Background(), st.k8sName(benchWorkspace(i)), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("label %s: %w", benchWorkspace(i), err)
		}
		return nil
	}, b)
	fmt.Printf("metadata: labelled and annotated %d workspaces through the aggregated API in %s (10 at a time)\n", n, time.Since(start).Round(time.Millisecond))
	_, body, _, err := st.fetch(agg + "?labelSelector=" + benchMetaLabel + "%3Dall")
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST -l "+benchMetaLabel+"=all", body, "items", n)

	_, metaBody, _, err := timedGet(st.hc, agg, "identity")
	if err != nil {
		b.Fatal(err)
	}
	metaAgg, metaCoderd := st.alternate(b, agg, coderd)
	withMeta := metaAgg.Seconds() / metaCoderd.Seconds()
	b.StopTimer()
	b.ReportMetric(plain, "list-plain-ratio")
	b.ReportMetric(withMeta, "list-meta-ratio")
	b.ReportMetric(float64(metaAgg.Microseconds())/1000, "list-meta-ms")
	b.ReportMetric(float64(plainAgg.Microseconds())/1000, "list-plain-ms")
	fmt.Printf("list ratio with stored metadata=%.2f (target: the same run's ratio without, %.2f, within noise): aggregated LIST median %s (without metadata %s), coderd median %s (%s); JSON %d KiB (without metadata %d KiB); %d workspaces, %d alternating pairs each\n",
		withMeta, plain, metaAgg.Round(100*time.Microsecond), plainAgg.Round(100*time.Microsecond),
		metaCoderd.Round(100*time.Microsecond), plainCoderd.Round(100*time.Microsecond), len(metaBody)/1024, len(plainBody)/1024, n, benchListPairs)
}

// benchTemplateApply times kubectl apply --server-side of a template
// whose files change against a ConfigMap of the same files.
func (st *benchStack) benchTemplateApply(b *testing.B) {
	name := st.org + ".bench-apply"
	st.benchApply(b, name, "apply", "with changed files", func(rev int) (tpl, cm string) {
		files := fmt.Sprintf("    main.tf: |\n%s", indent(mainTF+fmt.Sprintf("\n# revision %d\n", rev), 6))
		tpl = fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderTemplate\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  files:\n%s", name, benchNS, files)
		cm = fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench-apply\n  namespace: %s\ndata:\n%s", benchNS, strings.Replace(files, "    main.tf", "  main.tf", 1))
		return tpl, cm
	})
}

// benchTemplateSettingsApply times kubectl apply --server-side of a
// template whose settings and variables change (its files do not: a
// new version of the same files builds for the variable) against a
// ConfigMap holding the same files and values.
func (st *benchStack) benchTemplateSettingsApply(b *testing.B) {
	name := st.org + ".bench-settings"
	st.benchApply(b, name, "settings-apply", "with changed settings and variables", func(rev int) (tpl, cm string) {
		files := fmt.Sprintf("    main.tf: |\n%s", indent(mainTF, 6))
		ttl, bump, greeting := fmt.Sprintf("%dh", 1+rev), fmt.Sprintf("%dm", 30+rev), fmt.Sprintf("hello %d", rev)
		tpl = fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderTemplate\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  defaultTTL: %s\n  activityBump: %s\n  variables:\n  - {name: greeting, value: %q}\n  files:\n%s",
			name, benchNS, ttl, bump, greeting, files)
		cm = fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench-settings\n  namespace: %s\ndata:\n  defaultTTL: %s\n  activityBump: %s\n  greeting: %q\n%s",
			benchNS, ttl, bump, greeting, strings.Replace(files, "    main.tf", "  main.tf", 1))
		return tpl, cm
	})
}

// benchApply times kubectl apply --server-side of the template name and
// of a ConfigMap, alternating, for each revision manifests gives after a
// first unmeasured one, and reports the ratio as metric+"-ratio".
func (st *benchStack) benchApply(b *testing.B, name, metric, what string, manifests func(rev int) (tpl, cm string)) {
	apply := func(manifest string) time.Duration {
		d, out, err := runTimed(nil, st.kubectl, append(st.k.KubectlFlags(), "apply", "--server-side", "--field-manager=bench", "-f", writeManifest(b, manifest))...)
		if err != nil {
			b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
		}
		if !strings.Contains(string(out), " serverside-applied") {
			b.Fatalf("apply printed %q, want serverside-applied", out)
		}
		return d
	}
	var ts, cs []time.Duration
	for i := range 1 + benchApplyRuns {
		tpl, cm := manifests(i)
		var dt, dc time.Duration
		if i%2 == 0 {
			dt, dc = apply(tpl), apply(cm)
		} else {
			dc, dt = apply(cm), apply(tpl)
		}
		if i > 0 {
			ts, cs = append(ts, dt), append(cs, dc)
		}
	}
	// The last version builds before anything else is measured.
	if _, _, err := runTimed(nil, st.kubectl, append(st.k.KubectlFlags(), "wait", "--for=condition=Ready", "ctpl/"+name, "-n", benchNS, "--timeout=120s")...); err != nil {
		b.Fatal(err)
	}
	tm, cm := percentile(ts, 50), percentile(cs, 50)
	ratio := tm.Seconds() / cm.Seconds()
	b.ReportMetric(ratio, metric+"-ratio")
	b.ReportMetric(float64(tm.Milliseconds()), "template-"+metric+"-ms")
	b.ReportMetric(float64(cm.Milliseconds()), "configmap-"+metric+"-ms")
	fmt.Printf("template %s ratio=%.2f (target ≤ 1.5): kubectl apply --server-side of a CoderTemplate %s median %s (max %s), of a ConfigMap with the same data median %s; %d alternating runs, exec to exit\n",
		metric, ratio, what, tm.Round(time.Millisecond), percentile(ts, 100).Round(time.Millisecond), cm.Round(time.Millisecond), benchApplyRuns)
}

// benchMetaWatch times label changes made with kubectl until an open
// watch has them.
func (st *benchStack) benchMetaWatch(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := st.dyn.Resource(workspacesGVR).Watch(ctx, metav1.ListOptions{ResourceVersion: st.listRV(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	type labelled struct {
		name, value string
		at          time.Time
	}
	events := make(chan labelled, 10_000)
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified {
				continue
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				events <- labelled{u.GetName(), u.GetLabels()[benchMetaLabel], time.Now()}
			}
		}
		close(events)
	}()
	var lat, calls []time.Duration
	for i := range benchMetaChanges {
		name := st.k8sName(benchWorkspace(i))
		value := fmt.Sprintf("v%d", i)
		// Spread the changes over the poll cycle.
		time.Sleep(200*time.Millisecond + time.Duration(i*7%10)*st.watchPollInterval()/10)
		// The merge patch kubectl label sends.
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, benchMetaLabel, value)
		start := time.Now()
		if _, err := st.dyn.Resource(workspacesGVR).Namespace(benchNS).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "kubectl-label"}); err != nil {
			b.Fatal(err)
		}
		calls = append(calls, time.Since(start))
		deadline := time.After(30 * time.Second)
	wait:
		for {
			select {
			case e, ok := <-events:
				if !ok {
					b.Fatalf("the watch ended before the label change of %s", name)
				}
				if e.name == name && e.value == value {
					lat = append(lat, e.at.Sub(start))
					break wait
				}
			case <-deadline:
				b.Fatalf("the watch did not see %s=%s on %s within 30 s", benchMetaLabel, value, name)
			}
		}
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	b.ReportMetric(float64(p50.Microseconds())/1000, "meta-watch-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "meta-watch-p99-ms")
	fmt.Printf("metadata watch latency p50=%s p99=%s (target ≤ 1 s): from sending the label patch (what kubectl label sends) to the MODIFIED event with the new label at an open watch, %d changes; the PATCH itself took median %s (poll interval %s)\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), benchMetaChanges, percentile(calls, 50).Round(time.Millisecond), st.watchPollInterval())
}
