package e2e

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkWorkspaces/Admission.
const (
	// admissionPairs is how many pairs of operator starts, one with
	// admission on and one with it off, are measured.
	admissionPairs = 5
	// admissionLists is how many LISTs each start times, after its first
	// (which reads every build's parameters) and benchListWarmup more.
	admissionLists = 25
	// admissionApplies is how many template applies each start times.
	admissionApplies = 5
	// admissionBuildPoll is how often every start's promoter polls a
	// pending template build (templateBuildWait.initialPollInterval,
	// default 2s): the untimed wait for each apply's build is shorter,
	// and nothing is pending while an apply is timed.
	admissionBuildPoll = "500ms"
	// admissionPolicy names the ValidatingAdmissionPolicy and its binding.
	admissionPolicy  = "bench-admission-team"
	admissionMessage = "every CoderWorkspace and CoderTemplate needs a team label"
	// admissionRelease is the chart release every start runs as: the same
	// ServiceAccount and RBAC for both settings, applied again (unchanged)
	// at each start rather than a new release per start.
	admissionRelease = "coder-k8s-bench-admission"
	// Issue #29's bounds, on ÷ off.
	admissionListTarget  = 1.05
	admissionApplyTarget = 1.05
	admissionRSSTarget   = 1.10
)

// benchAdmission measures what the aggregated API server's admission chain
// costs: the same work with aggregatedAPIServer.admission.enabled true,
// with one ValidatingAdmissionPolicy bound that matches the written kind
// (the team label recipe of docs/policy.md, extended to codertemplates;
// every object written carries the label, so it admits), against the same
// work with it false:
//
//   - list: LIST of every coderworkspace through kube-apiserver, with the
//     measurement client of benchList. Admission does not run on reads;
//     the figure shows that the chain's watches of namespaces and the
//     cluster's admission configuration do not slow them.
//   - template apply: `kubectl apply --server-side` of a CoderTemplate
//     whose files change at every apply (a new version, as
//     benchTemplateApply), through kube-apiserver, from exec to exit: a
//     write the chain and the policy run on. Each apply's build is
//     awaited (untimed) until the version is active before the next, so
//     no import or promotion weighs on a timed apply.
//   - RSS: VmRSS of the operator process after that work.
//
// Like with like: one operator process at a time, the stack's own (all
// mode, the configuration of every other sub-benchmark but for a quicker
// promoter poll, admissionBuildPoll, the shipped binary), restarted with
// each setting and the APIService routed to it, as the same chart release
// (ServiceAccount and RBAC), against the same kube-apiserver, coderd,
// workspaces and policy objects.
// Two processes side by side would not compare: in all mode both would run
// the controllers on the same control plane, unless they shared a leader
// Lease, and then only the leader would run them (and hold their
// informers). Restarting also gives every start the same cache state
// (empty, then the same warm-up), keeps the idle setting's background
// work off the 2 cores while the other is measured, and gives RSS a sample
// per start. Each start is checked to be the setting it claims: with
// admission on a dry-run create of a template without the label is
// refused with the policy's message, with it off admitted.
//
// The starts come in admissionPairs pairs, the pairs alternating which
// setting starts first (off on, on off, ..., off on: the last start runs
// the default, on, for the sub-benchmarks after), so that drift over the
// run cancels. Each figure is the median over the pairs of the pair's
// on ÷ off ratio (of the start's median LIST, its median apply, its
// VmRSS). Every pair compares the same two settings, so the pair ratios
// differ from one another by noise alone: the run's own noise is their
// median absolute deviation from the figure (half of the pairs lie within
// it). A figure fails the benchmark when it is over its bound
// (admissionListTarget, admissionApplyTarget, admissionRSSTarget) by more
// than that noise.
func (st *benchStack) benchAdmission(b *testing.B, n int) {
	name := st.org + ".bench-admission"
	st.bindAdmissionPolicy(b)
	if exited, _ := st.op.Exited(); exited {
		st.restartOperator(b, true)
	}
	// The template's create (in Coder too) is not measured: every timed
	// apply is an update.
	rev := 0
	st.applyAdmissionTemplate(b, name, rev)
	b.ResetTimer()

	var on, off []admissionSample
	for p := range admissionPairs {
		order := []bool{true, false}
		if (admissionPairs-1-p)%2 == 0 {
			order = []bool{false, true}
		}
		for _, enabled := range order {
			s := st.admissionStart(b, enabled, name, &rev, n)
			if enabled {
				on = append(on, s)
			} else {
				off = append(off, s)
			}
		}
	}
	b.StopTimer()

	pick := func(ss []admissionSample, f func(admissionSample) float64) []float64 {
		out := make([]float64, len(ss))
		for i, s := range ss {
			out[i] = f(s)
		}
		return out
	}
	type figure struct {
		name, unit string
		target     float64
		value      func(admissionSample) float64
		scale      float64 // to the reported unit
	}
	listS := func(s admissionSample) float64 { return s.list.Seconds() }
	applyS := func(s admissionSample) float64 { return s.apply.Seconds() }
	rssMiB := func(s admissionSample) float64 { return s.rss.mib("VmRSS") }
	for _, f := range []figure{
		{"list", "ms", admissionListTarget, listS, 1000},
		{"apply", "ms", admissionApplyTarget, applyS, 1000},
		{"rss", "MiB", admissionRSSTarget, rssMiB, 1},
	} {
		onV, offV := pick(on, f.value), pick(off, f.value)
		ratios := make([]float64, len(onV))
		parts := make([]string, len(onV))
		for i := range onV {
			ratios[i] = onV[i] / offV[i]
			parts[i] = fmt.Sprintf("%.3f", ratios[i])
		}
		ratio, noise := medianAndDeviation(ratios)
		b.ReportMetric(ratio, f.name+"-ratio")
		b.ReportMetric(noise, f.name+"-noise")
		b.ReportMetric(median(onV)*f.scale, f.name+"-on-"+f.unit)
		b.ReportMetric(median(offV)*f.scale, f.name+"-off-"+f.unit)
		if ratio > f.target+noise {
			b.Errorf("admission %s ratio %.3f is over its bound %.2f by more than this run's noise %.3f (pair ratios %s)",
				f.name, ratio, f.target, noise, strings.Join(parts, " "))
		}
		fmt.Printf("admission %s ratio=%.3f (target ≤ %.2f beyond this run's noise ±%.3f): on %.1f %s, off %.1f %s (medians over %d starts each); pair ratios %s\n",
			f.name, ratio, f.target, noise, median(onV)*f.scale, f.unit, median(offV)*f.scale, f.unit, len(onV), strings.Join(parts, " "))
	}
	b.ReportMetric(float64(admissionPairs), "pairs")
	fmt.Printf("admission: %d pairs of operator starts (on: one ValidatingAdmissionPolicy bound, matching the written kind; off: aggregatedAPIServer.admission.enabled false); per start %d LISTs of %d workspaces and %d template applies, each build awaited\n",
		admissionPairs, admissionLists, n, admissionApplies)
}

// admissionSample is one start's figures.
type admissionSample struct {
	// list and apply are the start's medians.
	list, apply time.Duration
	rss         procStatus
}

// admissionStart restarts the operator with admission on or off, checks
// that it is that setting which serves, and measures the start's LISTs
// and template applies, then its memory.
func (st *benchStack) admissionStart(b *testing.B, enabled bool, name string, rev *int, n int) admissionSample {
	b.Helper()
	restart := st.restartOperator(b, enabled)
	st.checkAdmission(b, enabled)

	// The first LIST of a process reads every build's parameters.
	first, body, _, err := st.fetch(st.listURL)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST", body, "items", n)
	for range benchListWarmup {
		if _, _, _, err := st.fetch(st.listURL); err != nil {
			b.Fatal(err)
		}
	}
	lists := make([]time.Duration, 0, admissionLists)
	for range admissionLists {
		d, _, _, err := st.fetch(st.listURL)
		if err != nil {
			b.Fatal(err)
		}
		lists = append(lists, d)
	}
	applies := make([]time.Duration, 0, admissionApplies)
	for range admissionApplies {
		*rev++
		applies = append(applies, st.applyAdmissionTemplate(b, name, *rev))
	}
	s := admissionSample{list: percentile(lists, 50), apply: percentile(applies, 50), rss: st.rss(b)}
	fmt.Printf("admission %s: restart to discovery %s, first LIST %s, LIST median %s, template apply median %s (max %s), VmRSS %.1f MiB (anonymous %.1f MiB)\n",
		onOff(enabled), restart.Round(time.Millisecond), first.Round(time.Millisecond), s.list.Round(100*time.Microsecond),
		s.apply.Round(time.Millisecond), percentile(applies, 100).Round(time.Millisecond), s.rss.mib("VmRSS"), s.rss.mib("RssAnon"))
	return s
}

func onOff(enabled bool) string {
	if enabled {
		return "on"
	}
	return "off"
}

// restartOperator stops the stack's operator, starts it again with
// admission on or off, routes the APIService to it and returns how long
// that took from the start. The old process is gone first, so discovery
// answers only through the new one.
func (st *benchStack) restartOperator(b *testing.B, enabled bool) time.Duration {
	b.Helper()
	st.op.Stop(30 * time.Second)
	start := time.Now()
	st.op = st.startOperator(b, OperatorOptions{Release: admissionRelease,
		Aggregated: fmt.Sprintf("admission: {enabled: %t}, templateBuildWait: {initialPollInterval: %s}", enabled, admissionBuildPoll)})
	st.routeAPIService(b, st.op)
	d := time.Since(start)
	var err error
	if st.pid, err = processID(st.op); err != nil {
		b.Fatal(err)
	}
	return d
}

// checkAdmission waits until a dry-run create of a template without the
// team label is refused with the policy's message (admission on: once
// this process has compiled the policy) or admitted (off).
func (st *benchStack) checkAdmission(b *testing.B, enabled bool) {
	b.Helper()
	manifest := writeManifest(b, admissionTemplate(st.org+".bench-admission-probe", "", 0))
	testenv.WaitFor(b, 30*time.Second, func() error {
		out, err := st.run("create", "--dry-run=server", "-f", manifest)
		refused := err != nil && strings.Contains(out, admissionMessage)
		if enabled && refused || !enabled && err == nil {
			return nil
		}
		return errNotYet(fmt.Sprintf("admission %s: a dry-run create of a template without label team: %v %s", onOff(enabled), err, out))
	})
}

// applyAdmissionTemplate applies revision rev of the template with label
// team, as kubectl apply --server-side, checks what kubectl printed, waits
// (untimed) until that version is built and active, and returns the
// apply's time from exec to exit.
func (st *benchStack) applyAdmissionTemplate(b *testing.B, name string, rev int) time.Duration {
	b.Helper()
	manifest := writeManifest(b, admissionTemplate(name, "team: bench", rev))
	d, out, err := runTimed(nil, st.kubectl, append(st.k.KubectlFlags(), "apply", "--server-side", "--field-manager=bench", "-f", manifest)...)
	if err != nil {
		b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
	}
	if want := "codertemplate.aggregation.coder.com/" + name + " serverside-applied"; !strings.Contains(string(out), want) {
		b.Fatalf("apply printed %q, want %q", out, want)
	}
	if _, _, err := runTimed(nil, st.kubectl, append(st.k.KubectlFlags(), "wait", "--for=condition=Ready", "ctpl/"+name, "-n", benchNS, "--timeout=120s")...); err != nil {
		b.Fatal(err)
	}
	return d
}

// admissionTemplate is revision rev of template name (mainTF with a
// comment naming the revision) with labels, a YAML flow mapping's
// entries.
func admissionTemplate(name, labels string, rev int) string {
	return fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderTemplate\nmetadata:\n  name: %s\n  namespace: %s\n  labels: {%s}\nspec:\n  files:\n    main.tf: |\n%s",
		name, benchNS, labels, indent(mainTF+fmt.Sprintf("\n# revision %d\n", rev), 6))
}

// bindAdmissionPolicy applies the ValidatingAdmissionPolicy and its
// binding for the benchmark's duration: the team label recipe of
// docs/policy.md, matching codertemplates too.
func (st *benchStack) bindAdmissionPolicy(b *testing.B) {
	b.Helper()
	manifest := writeManifest(b, fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: %[1]s
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [aggregation.coder.com]
        apiVersions: ["*"]
        operations: [CREATE, UPDATE]
        resources: [coderworkspaces, codertemplates]
  validations:
    - expression: "has(object.metadata.labels) && 'team' in object.metadata.labels"
      message: %[2]s
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: %[1]s
spec:
  policyName: %[1]s
  validationActions: [Deny]
`, admissionPolicy, admissionMessage))
	if out, err := st.run("apply", "-f", manifest); err != nil {
		b.Fatalf("%v\n%s", err, out)
	}
	b.Cleanup(func() {
		_, _ = st.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", admissionPolicy, "--ignore-not-found")
	})
}

// medianAndDeviation returns the median of vs and the median absolute
// deviation of vs from it.
func medianAndDeviation(vs []float64) (float64, float64) {
	m := median(vs)
	dev := make([]float64, len(vs))
	for i, v := range vs {
		dev[i] = math.Abs(v - m)
	}
	return m, median(dev)
}
