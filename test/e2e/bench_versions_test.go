package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"golang.org/x/sync/errgroup"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkTemplateVersions: benchVersionTemplates templates
// of benchVersionsPer versions each.
const (
	benchVersionTemplates = 3
	benchVersionsPer      = 100
)

// BenchmarkTemplateVersions measures a LIST of every codertemplateversion
// (300) through kube-apiserver's aggregation layer against coderd's own
// versions lists of the same templates (GET
// /api/v2/templates/{id}/versions of each, one after another, as a client
// reads them), with the same HTTP client and the same Coder user (the
// admin's certificate maps to the first user, whose token the coderd
// requests carry): medians of alternating requests, after warm-ups that
// fill coder-k8s' caches of what never changes (sources, variables of
// ended builds). The versions are built by coderd's echo provisioner, so
// that seeding 300 takes seconds; their sources are protobuf, not text,
// so spec.files is empty and the figure is the versions' metadata.
func BenchmarkTemplateVersions(b *testing.B) {
	st := newBenchStack(b, 0, withCoder(testenv.CoderOptions{
		ProvisionerTypes:  []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho},
		DisableRateLimits: true,
	}))
	ctx := context.Background()
	tpls := st.seedVersions(b, ctx)
	n := benchVersionTemplates * benchVersionsPer
	agg := strings.TrimRight(st.k.Config.Host, "/") + "/apis/aggregation.coder.com/v1alpha1/namespaces/" + st.ns + "/codertemplateversions"
	refs := make([]string, len(tpls))
	for i, tpl := range tpls {
		refs[i] = fmt.Sprintf("%s/api/v2/templates/%s/versions", st.coder.URL, tpl.ID)
	}

	b.ResetTimer()
	cold, body, _, err := st.fetch(agg)
	if err != nil {
		b.Fatal(err)
	}
	st.checkItems(b, "aggregated LIST", body, "items", n)
	fmt.Printf("versions list: first aggregated LIST (reads every version's variables once) %s\n", cold.Round(time.Millisecond))
	coderd := func() (time.Duration, int, error) {
		var total time.Duration
		count := 0
		for _, u := range refs {
			d, body, _, err := timedGet(st.hc, u, "")
			if err != nil {
				return 0, 0, err
			}
			var vs []json.RawMessage
			if err := json.Unmarshal(body, &vs); err != nil {
				return 0, 0, err
			}
			total += d
			count += len(vs)
		}
		return total, count, nil
	}
	var aggs, coders []time.Duration
	for i := range benchListWarmup + benchListPairs {
		first, second := true, false
		if i%2 == 1 {
			first, second = false, true
		}
		for _, aggTurn := range []bool{first, second} {
			if aggTurn {
				d, body, _, err := st.fetch(agg)
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 {
					st.checkItems(b, "aggregated LIST", body, "items", n)
				}
				if i >= benchListWarmup {
					aggs = append(aggs, d)
				}
				continue
			}
			d, count, err := coderd()
			if err != nil {
				b.Fatal(err)
			}
			if count != n {
				b.Fatalf("coderd lists %d versions of the templates, want %d", count, n)
			}
			if i >= benchListWarmup {
				coders = append(coders, d)
			}
		}
	}
	b.StopTimer()
	aggMed, coderMed := percentile(aggs, 50), percentile(coders, 50)
	ratio := reportRatio(b, "list", aggMed, coderMed)
	b.ReportMetric(float64(n), "versions")
	st.versionsBreakdown(b, agg, refs)
	fmt.Printf("versions list ratio=%.2f (target ≤ 1.2): aggregated LIST of %d codertemplateversions median %s, coderd GET /api/v2/templates/{id}/versions of the %d templates median %s; %d alternating pairs\n",
		ratio, n, aggMed.Round(100*time.Microsecond), len(tpls), coderMed.Round(100*time.Microsecond), benchListPairs)
}

// seedVersions pushes benchVersionTemplates echo templates and adds
// versions to each (one source shared by all: coderd's files are content
// addressed: the source of the first push) until each has benchVersionsPer, all built.
func (st *benchStack) seedVersions(b *testing.B, ctx context.Context) []codersdk.Template {
	b.Helper()
	start := time.Now()
	tpls := make([]codersdk.Template, benchVersionTemplates)
	for i := range tpls {
		var err error
		if tpls[i], err = st.coder.PushEchoTemplate(ctx, fmt.Sprintf("bench-tv-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	// The echo source every template was pushed with.
	first, err := st.coder.Client.TemplateVersion(ctx, tpls[0].ActiveVersionID)
	if err != nil {
		b.Fatal(err)
	}
	fileID := first.Job.FileID
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, tpl := range tpls {
		for j := 1; j < benchVersionsPer; j++ {
			g.Go(func() error {
				_, err := st.coder.Client.CreateTemplateVersion(gctx, st.coder.OrganizationID, codersdk.CreateTemplateVersionRequest{
					TemplateID: tpl.ID, Name: fmt.Sprintf("v%03d", j), StorageMethod: codersdk.ProvisionerStorageMethodFile,
					FileID: fileID, Provisioner: codersdk.ProvisionerTypeEcho})
				return err
			})
		}
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("create template versions: %v", err)
	}
	testenv.WaitFor(b, 5*time.Minute, func() error {
		for _, tpl := range tpls {
			vs, err := st.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: tpl.ID})
			if err != nil {
				return err
			}
			for _, v := range vs {
				if v.Job.Status != codersdk.ProvisionerJobSucceeded {
					return fmt.Errorf("version %s of %s is %s", v.Name, tpl.Name, v.Job.Status)
				}
			}
			if len(vs) != benchVersionsPer {
				return fmt.Errorf("template %s has %d versions", tpl.Name, len(vs))
			}
		}
		return nil
	})
	fmt.Printf("versions: %d templates of %d built versions each seeded in %s\n", len(tpls), benchVersionsPer, time.Since(start).Round(time.Millisecond))
	return tpls
}

// versionsBreakdown shows where the aggregated LIST's time goes: through
// kube-apiserver and straight to coder-k8s, next to what coder-k8s asks
// coderd for (the templates, then their versions lists at once).
func (st *benchStack) versionsBreakdown(b *testing.B, agg string, refs []string) {
	b.Helper()
	direct := st.op.Aggregated + "/apis/aggregation.coder.com/v1alpha1/namespaces/" + st.ns + "/codertemplateversions"
	templates := st.coder.URL.String() + "/api/v2/templates"
	parallel := func() (time.Duration, error) {
		start := time.Now()
		var g errgroup.Group
		for _, u := range refs {
			g.Go(func() error { _, _, _, err := timedGet(st.hc, u, ""); return err })
		}
		err := g.Wait()
		return time.Since(start), err
	}
	printBreakdown(b, "versions list", []breakdownStep{
		st.getStep("through kube-apiserver", agg),
		st.getStep("coder-k8s directly", direct),
		st.getStep("coderd templates list", templates),
		{name: "coderd versions lists at once", f: parallel},
	})
}
