package storage

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestReadsDuringPromotion checks what a read of a template shows when
// the promoter (of this or another replica) promotes its build while
// the read is under way: coderd has answered the read with the template
// as it was before the promotion, and the promotion (the new version
// made active in Coder, then the build cleared from the record) is done
// before the answer reaches coder-k8s. Both a GET and a watch-cache poll
// show the build still under way, never the old version active with no
// build (which nothing would correct until the next poll); and the
// promoter's event for the record then brings the new version to the
// watch cache.
//
// The storage's promoter does not run until the last step, so that the
// test decides when each promotion happens: a proxy in front of coderd
// runs the promoter's own check of the build between coderd's answer and
// its delivery.
func TestReadsDuringPromotion(t *testing.T) {
	const ns = "promoting"
	ts := newTemplateStack(t, ns, "promoting")
	ctx, cancel, rctx, s, name, tpl := ts.ctx, ts.cancel, ts.rctx, ts.s, ts.name, ts.tpl
	c, proxy, b := ts.coder, ts.proxy, ts.backend
	key := records.Key{Namespace: ns, Resource: s.gr.Resource, CoderID: string(tpl.UID)}
	// promote runs the promoter's check of versionID's build once its
	// import has ended: it makes the version active in Coder and clears
	// the build from the record.
	promote := func(versionID string) error {
		if err := waitImported(ctx, c, versionID); err != nil {
			return err
		}
		tg, ok := s.backendOf(ctx, key)
		if !ok {
			return fmt.Errorf("no backend for %v", key)
		}
		rec, err := s.records.get(ctx, key)
		if err != nil || rec == nil || rec.Spec.Build == nil || rec.Spec.Build.VersionID != versionID {
			return fmt.Errorf("the record of %s does not hold the build of %s: %+v, %v", name, versionID, rec, err)
		}
		p := newPromoter(s)
		defer p.queue.ShutDown()
		if !p.checkBuild(ctx, tg, key, rec) {
			return fmt.Errorf("the promoter's check of %s's build %s did not finish it", name, versionID)
		}
		if rec, err := s.records.get(ctx, key); err != nil || rec == nil || rec.Spec.Build != nil {
			return fmt.Errorf("after the promotion the record of %s still holds a build: %+v, %v", name, rec, err)
		}
		return nil
	}
	// promoteOnAnswer has the proxy promote versionID's build once coderd
	// has answered endpoint, before the answer is passed on.
	promoteOnAnswer := func(endpoint, versionID string) (promoted <-chan error) {
		ch := make(chan error, 1)
		proxy.OnAnswer(endpoint, func() {
			proxy.OnAnswer(endpoint, nil)
			ch <- promote(versionID)
		})
		return ch
	}
	// promotedOK checks that the proxy promoted the build.
	promotedOK := func(t *testing.T, promoted <-chan error) {
		t.Helper()
		select {
		case err := <-promoted:
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("the read did not reach coderd: nothing was promoted while it ran")
		}
	}
	// update sets new files and returns the version now building.
	update := func(t *testing.T, n int) string {
		t.Helper()
		cur, err := s.Get(rctx, name, &metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next := cur.(*aggv1.CoderTemplate).DeepCopy()
		next.Spec.Files = map[string]string{"main.tf": fmt.Sprintf("output \"n\" {\n  value = %d\n}\n", n)}
		out, _, err := s.Update(rctx, name, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		building := out.(*aggv1.CoderTemplate).Status.BuildingVersionID
		if building == "" {
			t.Fatalf("update %d shows no building version", n)
		}
		return building
	}
	// stillBuilding checks that o shows versionID built but not yet
	// active, with active still active.
	stillBuilding := func(t *testing.T, what string, o *aggv1.CoderTemplate, active, versionID string) {
		t.Helper()
		c := readyCondition(o)
		if o.Status.ActiveVersionID != active || o.Status.BuildingVersionID != versionID || readyOf(o) != "False Building" {
			t.Errorf("%s shows active=%s building=%s Ready=%s %s %q; want active=%s building=%s Ready=False Building (the build is done, its promotion not yet seen)",
				what, o.Status.ActiveVersionID, o.Status.BuildingVersionID, c.Status, c.Reason, c.Message, active, versionID)
		}
	}
	if err := promote(tpl.Status.ActiveVersionID); err != nil { // the first version's build
		t.Fatal(err)
	}
	active := tpl.Status.ActiveVersionID

	t.Run("a GET answered before the promotion shows the build under way", func(t *testing.T) {
		building := update(t, 1)
		promoted := promoteOnAnswer("GET "+testenv.Endpoint(fmt.Sprintf("/api/v2/organizations/%s/templates/promoting", c.OrganizationID)), building)
		out, err := s.Get(rctx, name, &metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		promotedOK(t, promoted)
		stillBuilding(t, "the GET", out.(*aggv1.CoderTemplate), active, building)
		active = building
	})

	t.Run("a poll that listed before the promotion shows the build under way; the record's event brings the promotion", func(t *testing.T) {
		building := update(t, 2)
		promoted := promoteOnAnswer("GET /api/v2/templates", building)
		if err := s.cache.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		promotedOK(t, promoted)
		polled, ok := s.cache.Get(b.Key(), name)
		if !ok {
			t.Fatalf("the poll left no %s in the watch cache", name)
		}
		stillBuilding(t, "the poll", polled.(*aggv1.CoderTemplate), active, building)

		// The promoter's record watch sees the cleared build (as an add:
		// it starts now) and reads the template again. The watch cache
		// is what every watch is sent; no poll runs (no watcher).
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		testenv.WaitFor(t, 30*time.Second, func() error {
			o, _ := s.cache.Get(b.Key(), name)
			got := o.(*aggv1.CoderTemplate)
			if got.Status.ActiveVersionID != building || got.Status.BuildingVersionID != "" || readyOf(got) != "True Succeeded" {
				return fmt.Errorf("the watch cache shows active=%s building=%s Ready=%s; want active=%s building= Ready=True Succeeded",
					got.Status.ActiveVersionID, got.Status.BuildingVersionID, readyOf(got), building)
			}
			return nil
		})
		if n := s.cache.Stats().Polls; n != 1 {
			t.Errorf("the watch cache polled %d times; want 1 (the test's)", n)
		}
	})
}

// waitImported waits until coderd has imported template version id.
// templateStack is a template storage on a backendStack, whose watch
// cache polls only when asked (an hour apart), holding one template made
// through it. Neither the storage nor its promoter runs until the test
// starts them.
type templateStack struct {
	*backendStack
	s *TemplateStorage
	// ctx ends with the test, or with cancel; rctx is ctx in the
	// namespace.
	ctx, rctx context.Context
	cancel    context.CancelFunc
	// name is the template's, <organization>.<template>.
	name string
	tpl  *aggv1.CoderTemplate
}

func newTemplateStack(t *testing.T, ns, template string) *templateStack {
	t.Helper()
	bs := newBackendStack(t, ns)
	ctx, cancel := context.WithCancel(bs.ctx)
	t.Cleanup(cancel)
	s, err := NewTemplates(Options{Backends: fxProvider{backends: []backend.Backend{bs.backend}}, PollInterval: time.Hour, Records: bs.records, Log: testr.New(t)},
		TemplateOptions{Limits: templatesource.DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	rctx := genericapirequest.WithNamespace(ctx, ns)
	name := bs.org + "." + template
	created, err := s.Create(rctx, &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: aggv1.CoderTemplateSpec{Files: testenv.ProviderFreeTemplate()}}, nil, &metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &templateStack{backendStack: bs, s: s, ctx: ctx, rctx: rctx, cancel: cancel, name: name, tpl: created.(*aggv1.CoderTemplate)}
}

func waitImported(ctx context.Context, c *testenv.Coder, id string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		v, err := c.Client.TemplateVersion(ctx, uuid.MustParse(id))
		if err != nil {
			return err
		}
		if !buildInProgress(v.Job.Status) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("version %s: job still %s after 2m", id, v.Job.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
