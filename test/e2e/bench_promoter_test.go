package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkPromoter.
const (
	// benchHungBuilds is how many template builds are pending in the
	// coderd that stops answering.
	benchHungBuilds = 20
	// benchPromotions is how many promotions each figure is taken over:
	// the delay depends on where in the poll interval the import ends.
	benchPromotions = 11
)

// BenchmarkPromoter measures how long after its import finished a
// template version becomes active (the update's watch event showing it
// active and Ready), in units of templateBuildWait.initialPollInterval,
// while another namespace's coderd has stopped answering with 20 template
// builds pending in it (target ≤ 1: the hung coderd delays the other
// coderd's promotions by no more than one poll interval), against a
// reference measured in the same run before that coderd stopped
// answering. The operator runs with the default configuration: each of
// the hung polls waits out the 30 s Coder request timeout.
//
//	go test ./test/e2e/ -run '^$' -bench '^BenchmarkPromoter$' -benchtime 1x
func BenchmarkPromoter(b *testing.B) {
	// Without rate limits: coderd takes 12 file uploads a minute, fewer
	// than the benchmark makes.
	s := newStack(b, withOperatorIdentity(), withOperator(OperatorOptions{Args: []string{"--log-level", "info"}}),
		withCoder(testenv.CoderOptions{DisableRateLimits: true}))
	ctx := context.Background()
	poll := config.Default().AggregatedAPIServer.TemplateBuildWait.InitialPollInterval.Duration

	// The other coderd's provisioners run only echo jobs, so its
	// Terraform imports stay pending; a proxy in front of it stops
	// answering on demand.
	other := testenv.NewCoder(b, testenv.CoderOptions{Postgres: s.coder.Postgres, DisableRateLimits: true,
		ProvisionerTypes: []codersdk.ProvisionerType{codersdk.ProvisionerTypeEcho}})
	proxy := testenv.NewCountingProxy(b, other.URL)
	const hungNS = "hung"
	createAdoptingControlPlane(b, s, hungNS, "coder", proxy.URL.String(), other.SessionToken)
	waitOperatorAccess(b, s, hungNS, "coder", proxy.URL.String(), 60*time.Second)
	org, err := other.Client.Organization(ctx, other.OrganizationID)
	if err != nil {
		b.Fatal(err)
	}

	pm := newPromotions(b, s, "promoted")
	b.ResetTimer()
	ref := pm.measure(b, benchPromotions)

	for i := range benchHungBuilds {
		tpl := &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.hung-%02d", org.Name, i), Namespace: hungNS},
			Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}
		if err := s.c.Create(ctx, tpl); err != nil {
			b.Fatalf("create %s: %v", tpl.Name, err)
		}
	}
	proxy.SetDelay(time.Hour)
	// Within one poll interval every check slot of the hung coderd holds
	// a poll that waits for the request timeout.
	time.Sleep(2 * poll)
	hung := pm.measure(b, benchPromotions)
	b.StopTimer()
	held := proxy.Abandoned()
	proxy.SetDelay(0)

	ratio := func(ds []time.Duration, p float64) float64 { return percentile(ds, p).Seconds() / poll.Seconds() }
	b.ReportMetric(ratio(hung, 50), "promote-hung-ratio")
	b.ReportMetric(ratio(hung, 100), "promote-hung-max-ratio")
	b.ReportMetric(ratio(ref, 50), "promote-ref-ratio")
	b.ReportMetric(ratio(ref, 100), "promote-ref-max-ratio")
	b.ReportMetric(float64(poll.Milliseconds()), "poll-interval-ms")
	fmt.Printf("promotion delay ÷ poll interval with %d builds hung in another coderd: median %.2f, max %.2f (target ≤ 1); reference without: median %.2f, max %.2f; poll interval %s, %d promotions each\n",
		benchHungBuilds, ratio(hung, 50), ratio(hung, 100), ratio(ref, 50), ratio(ref, 100), poll, benchPromotions)
	fmt.Printf("promotion delays with the hung coderd: %s; reference: %s; %d requests to the hung coderd held until coder-k8s gave up\n", roundAll(hung), roundAll(ref), held)
}

// promotions updates one template's files in the stack's namespace and
// times each new version's promotion through a watch.
type promotions struct {
	s    *aggStack
	name string
	w    watch.Interface
	cur  *aggv1.CoderTemplate
}

// newPromotions creates template name and waits until its first version
// is active.
func newPromotions(b *testing.B, s *aggStack, name string) *promotions {
	b.Helper()
	ctx := context.Background()
	wc, err := client.NewWithWatch(s.k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	pm := &promotions{s: s, name: s.org + "." + name}
	tpl := &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: pm.name, Namespace: s.ns},
		Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}
	if err := s.c.Create(ctx, tpl); err != nil {
		b.Fatal(err)
	}
	if pm.w, err = wc.Watch(ctx, &aggv1.CoderTemplateList{}, client.InNamespace(s.ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: tpl.ResourceVersion}}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pm.w.Stop)
	pm.cur, _ = pm.waitActive(b, tpl.Status.ActiveVersionID)
	return pm
}

// measure makes n new versions one after another and returns, for each,
// the time from its import's end (coderd's completion time) to the watch
// event showing it active.
func (pm *promotions) measure(b *testing.B, n int) []time.Duration {
	b.Helper()
	ctx := context.Background()
	var out []time.Duration
	for range n {
		next := pm.cur.DeepCopy()
		next.Spec.Files = map[string]string{"main.tf": fmt.Sprintf("output \"version\" {\n  value = %q\n}\n", uuid.NewString())}
		if err := pm.s.c.Update(ctx, next); err != nil {
			b.Fatal(err)
		}
		building := next.Status.BuildingVersionID
		if building == "" {
			b.Fatalf("the update of %s shows no building version", pm.name)
		}
		var seen time.Time
		pm.cur, seen = pm.waitActive(b, building)
		v, err := pm.s.coder.Client.TemplateVersion(ctx, uuid.MustParse(building))
		if err != nil {
			b.Fatal(err)
		}
		if v.Job.CompletedAt == nil {
			b.Fatalf("version %s is active but its import has no completion time", building)
		}
		out = append(out, seen.Sub(*v.Job.CompletedAt))
	}
	return out
}

// waitActive waits for the watch event showing version active and built.
func (pm *promotions) waitActive(b *testing.B, version string) (*aggv1.CoderTemplate, time.Time) {
	b.Helper()
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case ev, ok := <-pm.w.ResultChan():
			if !ok {
				b.Fatal("the template watch closed")
			}
			o, ok := ev.Object.(*aggv1.CoderTemplate)
			if ok && o.Name == pm.name && o.Status.ActiveVersionID == version && o.Status.BuildingVersionID == "" &&
				apimeta.IsStatusConditionTrue(o.Status.Conditions, aggv1.ConditionReady) {
				return o, time.Now()
			}
		case <-timeout:
			cur := &aggv1.CoderTemplate{}
			_ = pm.s.c.Get(context.Background(), types.NamespacedName{Namespace: pm.s.ns, Name: pm.name}, cur)
			b.Fatalf("version %s of %s not active within 3 minutes (active %s, building %s); operator log tail:\n%s",
				version, pm.name, cur.Status.ActiveVersionID, cur.Status.BuildingVersionID, pm.s.op.LogTail(30))
		}
	}
}

// roundAll lists ds, sorted, to the millisecond.
func roundAll(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	out := make([]string, len(s))
	for i, d := range s {
		out[i] = d.Round(time.Millisecond).String()
	}
	return fmt.Sprint(out)
}
