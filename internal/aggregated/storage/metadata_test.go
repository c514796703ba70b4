package storage

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// metaStack is the real stack the metadata tests run on: kube-apiserver
// holding the records, coderd (behind a counting proxy, to see which
// requests reach it) holding the objects, and the storages as the
// aggregated API server builds them.
type metaStack struct {
	ctx   context.Context // carries the namespace, as a request does
	coder *testenv.Coder
	proxy *testenv.CountingProxy
	kube  client.Client
	tpls  *TemplateStorage
	wss   *WorkspaceStorage
	org   string
	// version is a built template version of no template yet.
	version uuid.UUID
}

const metaNS = "team-a"

func newMetaStack(t *testing.T) *metaStack {
	t.Helper()
	return newMetaStackPolling(t, 200*time.Millisecond)
}

// newMetaStackPolling is newMetaStack with the storages polling coderd
// every interval.
func newMetaStackPolling(t *testing.T, interval time.Duration) *metaStack {
	t.Helper()
	bs := newBackendStack(t, metaNS)
	ctx, cancel := context.WithCancel(bs.ctx)
	o := Options{Backends: fxProvider{backends: []backend.Backend{bs.backend}}, PollInterval: interval, Records: bs.records, Log: testr.New(t)}
	tpls, err := NewTemplates(o, TemplateOptions{Limits: templatesource.DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	wss, err := NewWorkspaces(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { tpls.Run(ctx); done <- struct{}{} }()
	go func() { wss.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	ms := &metaStack{ctx: genericapirequest.WithNamespace(ctx, metaNS), coder: bs.coder, proxy: bs.proxy, kube: bs.kube, tpls: tpls, wss: wss, org: bs.org}
	ms.version = ms.buildVersion(t)
	return ms
}

// backendStack is one real coderd, behind a counting proxy (to see which
// requests reach it), as the backend of a namespace, and kube-apiserver
// holding the records.
type backendStack struct {
	ctx     context.Context // ends with the test
	coder   *testenv.Coder
	proxy   *testenv.CountingProxy
	kube    client.Client
	records *records.Store
	// backend is the coderd as namespace ns's control plane "", through
	// the proxy.
	backend backend.Backend
	// org is the name of the coderd's default organization.
	org string
}

func newBackendStack(t *testing.T, ns string) *backendStack {
	t.Helper()
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	c := testenv.NewCoder(t, testenv.CoderOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	bs := &backendStack{ctx: ctx, coder: c, proxy: testenv.NewCountingProxy(t, c.URL)}
	bs.records, bs.kube = startRecords(t, ctx, k)
	if err := bs.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	org, err := c.Client.Organization(ctx, c.OrganizationID)
	if err != nil {
		t.Fatal(err)
	}
	bs.org = org.Name
	bs.backend = backend.Backend{Namespace: ns, URL: bs.proxy.URL,
		Client: coderapi.NewClient(bs.proxy.URL, c.SessionToken, 30*time.Second, coderapi.Target{})}
	return bs
}

// startRecords starts a records store on k as the aggregated API server
// has one (an informer cache until ctx ends, and a client that writes),
// and returns it with a client of k.
func startRecords(t *testing.T, ctx context.Context, k *testenv.KubeAPI) (*records.Store, client.Client) {
	t.Helper()
	s := scheme.New()
	co := kubecache.Options()
	co.Scheme = s
	rc, err := cache.New(k.Config, co)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = rc.Start(ctx) }()
	kc, err := client.New(k.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	store := records.New(rc, kc)
	if err := store.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return store, kc
}

// buildVersion uploads the provider-free template as a version of no
// template and waits until it has built.
func (ms *metaStack) buildVersion(t *testing.T) uuid.UUID {
	t.Helper()
	fileID, err := templatesource.Upload(ms.ctx, ms.coder.Client, testenv.ProviderFreeTemplate(), templatesource.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ms.coder.Client.CreateTemplateVersion(ms.ctx, ms.coder.OrganizationID, codersdk.CreateTemplateVersionRequest{
		StorageMethod: codersdk.ProvisionerStorageMethodFile, FileID: fileID, Provisioner: codersdk.ProvisionerTypeTerraform})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		v, err = ms.coder.Client.TemplateVersion(ms.ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.Job.Status == codersdk.ProvisionerJobSucceeded {
			return v.ID
		}
		if !buildInProgress(v.Job.Status) || time.Now().After(deadline) {
			t.Fatalf("template version build: %s %s", v.Job.Status, v.Job.Error)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// createTemplate creates a template through the storage from the built
// version, with meta's labels, annotations and finalizers.
func (ms *metaStack) createTemplate(t *testing.T, name string, meta metav1.ObjectMeta, dryRun bool) *aggv1.CoderTemplate {
	t.Helper()
	meta.Name = ms.org + "." + name
	in := &aggv1.CoderTemplate{ObjectMeta: meta, Spec: aggv1.CoderTemplateSpec{VersionID: ms.version.String(), DisplayName: "Meta " + name}}
	opts := &metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, err := ms.tpls.Create(ms.ctx, in, nil, opts)
	if err != nil {
		t.Fatalf("create %s: %v", meta.Name, err)
	}
	return out.(*aggv1.CoderTemplate)
}

func (ms *metaStack) getTemplate(t *testing.T, name string) *aggv1.CoderTemplate {
	t.Helper()
	out, err := ms.tpls.Get(ms.ctx, name, &metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return out.(*aggv1.CoderTemplate)
}

// updateTemplate replaces the template with what change makes of the
// current object, as a PUT does.
func (ms *metaStack) updateTemplate(t *testing.T, name string, dryRun bool, change func(*aggv1.CoderTemplate)) (*aggv1.CoderTemplate, error) {
	t.Helper()
	next := ms.getTemplate(t, name).DeepCopy()
	change(next)
	opts := &metav1.UpdateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, _, err := ms.tpls.Update(ms.ctx, name, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, opts)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderTemplate), nil
}

func (ms *metaStack) record(t *testing.T, obj metav1.Object, resource string) *records.Record {
	t.Helper()
	var r records.Record
	key := records.Key{Namespace: metaNS, Resource: resource, CoderID: string(obj.GetUID())}
	if err := ms.kube.Get(ms.ctx, key.NamespacedName(), &r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return &r
}

// coderWrites counts the requests that could change something in coderd.
func coderWrites(s testenv.ProxyStats) int64 {
	var n int64
	for ep, st := range s {
		if !strings.HasPrefix(ep, "GET ") {
			n += st.Requests
		}
	}
	return n
}

// nextEvent waits up to within for the watch's next event about name.
func nextEvent(t *testing.T, w watch.Interface, name string, within time.Duration) watch.Event {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed")
			}
			if o, ok := ev.Object.(metav1.Object); ok && o.GetName() == name {
				return ev
			}
		case <-timeout:
			t.Fatalf("no watch event for %s within %v", name, within)
		}
	}
}

func TestDurableMetadata(t *testing.T) {
	ms := newMetaStack(t)
	mf := []metav1.ManagedFieldsEntry{{Manager: "argocd-controller", Operation: metav1.ManagedFieldsOperationApply,
		APIVersion: aggv1.SchemeGroupVersion.String(), FieldsType: "FieldsV1", Time: &metav1.Time{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:team":{}}},"f:spec":{"f:displayName":{}}}`)}}
	meta := metav1.ObjectMeta{
		Labels:          map[string]string{"team": "a", aggv1.LabelTemplate: "alpha"},
		Annotations:     map[string]string{"argocd.argoproj.io/tracking-id": "app:aggregation.coder.com/CoderTemplate:team-a/x"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "0b6c1d51-7d1e-4d31-9d44-5b3c0d1f8e11"}},
		ManagedFields:   mf,
	}

	// Create: the dry run answers what the real create returns.
	dry := ms.createTemplate(t, "alpha", *meta.DeepCopy(), true)
	created := ms.createTemplate(t, "alpha", *meta.DeepCopy(), false)
	name := created.Name
	wantLabels := map[string]string{"team": "a", aggv1.LabelTemplate: "alpha", aggv1.LabelOrganization: ms.org}
	if !apiequality.Semantic.DeepEqual(created.Labels, wantLabels) {
		t.Errorf("created labels = %v, want %v", created.Labels, wantLabels)
	}
	if !apiequality.Semantic.DeepEqual(created.Annotations, meta.Annotations) || !apiequality.Semantic.DeepEqual(created.OwnerReferences, meta.OwnerReferences) ||
		!apiequality.Semantic.DeepEqual(created.ManagedFields, mf) {
		t.Errorf("created metadata: annotations %v, ownerReferences %v, managedFields %v", created.Annotations, created.OwnerReferences, created.ManagedFields)
	}
	checkGeneration(t, created, 1)
	for _, d := range []struct {
		what      string
		dry, real any
	}{{"labels", dry.Labels, created.Labels}, {"annotations", dry.Annotations, created.Annotations},
		{"ownerReferences", dry.OwnerReferences, created.OwnerReferences}, {"managedFields", dry.ManagedFields, created.ManagedFields},
		{"generation", dry.Generation, created.Generation}, {"spec.displayName", dry.Spec.DisplayName, created.Spec.DisplayName},
		{"spec.files", dry.Spec.Files, created.Spec.Files}, {"status.organization", dry.Status.Organization, created.Status.Organization},
		{"Ready", readyOf(dry), readyOf(created)}, {"import in progress", buildInProgress(codersdk.ProvisionerJobStatus(dry.Status.BuildStatus)),
			buildInProgress(codersdk.ProvisionerJobStatus(created.Status.BuildStatus))}} {
		if !apiequality.Semantic.DeepEqual(d.dry, d.real) {
			t.Errorf("dry-run create %s = %v, the create returned %v", d.what, d.dry, d.real)
		}
	}
	rec := ms.record(t, created, coderv1alpha1.RecordResourceTemplates)
	if rec == nil {
		t.Fatal("the create saved no record")
	}
	if !apiequality.Semantic.DeepEqual(rec.Spec.Labels, map[string]string{"team": "a"}) || rec.Spec.Generation != 1 || rec.Spec.Name != name {
		t.Errorf("record spec = labels %v, generation %d, name %q; want only the user's label, 1, %q", rec.Spec.Labels, rec.Spec.Generation, rec.Spec.Name, name)
	}
	if got := ms.getTemplate(t, name); got.ResourceVersion != created.ResourceVersion || !apiequality.Semantic.DeepEqual(got.Labels, created.Labels) {
		t.Errorf("GET after create: rv %s labels %v; the create returned rv %s labels %v", got.ResourceVersion, got.Labels, created.ResourceVersion, created.Labels)
	}
	l, err := ms.tpls.List(ms.ctx, &metainternalversion.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if items := l.(*templateList).Items; len(items) != 1 || items[0].Labels["team"] != "a" || items[0].Annotations == nil {
		t.Errorf("LIST from coderd = %+v, want the template with its metadata", items)
	}

	t.Run("derived labels stay derived", func(t *testing.T) {
		before := ms.getTemplate(t, name)
		_, err := ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Labels[aggv1.LabelTemplate] = "beta" })
		var se apierrors.APIStatus
		if !apierrors.IsInvalid(err) || !errors.As(err, &se) || len(se.Status().Details.Causes) != 1 ||
			se.Status().Details.Causes[0].Field != "metadata.labels["+aggv1.LabelTemplate+"]" {
			t.Fatalf("setting a derived label: %v, want 422 at metadata.labels[%s]", err, aggv1.LabelTemplate)
		}
		// The derived value itself is accepted, and changes nothing.
		out, err := ms.updateTemplate(t, name, false, func(*aggv1.CoderTemplate) {})
		if err != nil || out.ResourceVersion != before.ResourceVersion {
			t.Fatalf("repeating the derived labels: %v, rv %s -> %s", err, before.ResourceVersion, out.ResourceVersion)
		}
	})

	t.Run("metadata-only update", func(t *testing.T) {
		before := ms.getTemplate(t, name)
		w, err := ms.tpls.Watch(ms.ctx, &metainternalversion.ListOptions{ResourceVersion: before.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		stats := ms.proxy.Stats()
		dry, err := ms.updateTemplate(t, name, true, func(o *aggv1.CoderTemplate) { o.Labels["env"] = "prod" })
		if err != nil {
			t.Fatal(err)
		}
		if r := ms.record(t, before, coderv1alpha1.RecordResourceTemplates); r.Spec.Labels["env"] != "" {
			t.Fatal("the dry run wrote the record")
		}
		start := time.Now()
		out, err := ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Labels["env"] = "prod" })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("label change through the storage took %v", time.Since(start))
		if n := coderWrites(ms.proxy.Stats().Since(stats)); n != 0 {
			t.Errorf("a label change made %d write requests to coderd, want 0", n)
		}
		if out.Labels["env"] != "prod" || out.ResourceVersion == before.ResourceVersion || out.Generation != before.Generation {
			t.Errorf("after the label change: labels %v, rv %s (was %s), generation %d (was %d)", out.Labels, out.ResourceVersion, before.ResourceVersion, out.Generation, before.Generation)
		}
		dry.ResourceVersion = out.ResourceVersion
		if !apiequality.Semantic.DeepEqual(dry, out) {
			t.Errorf("the dry run returned\n%+v\nthe update returned\n%+v", dry, out)
		}
		ev := nextEvent(t, w, name, time.Second)
		t.Logf("the label change reached the open watch %v after the request started", time.Since(start))
		if got := ev.Object.(*aggv1.CoderTemplate); ev.Type != watch.Modified || got.Labels["env"] != "prod" || got.ResourceVersion != out.ResourceVersion {
			t.Errorf("watch event %s labels %v rv %s; want MODIFIED with env=prod at rv %s", ev.Type, got.Labels, got.ResourceVersion, out.ResourceVersion)
		}

		// A record changed elsewhere (another replica) reaches the watch too.
		r := ms.record(t, before, coderv1alpha1.RecordResourceTemplates)
		r.Spec.Annotations["note"] = "from another replica"
		start = time.Now()
		if err := ms.kube.Update(ms.ctx, r); err != nil {
			t.Fatal(err)
		}
		ev = nextEvent(t, w, name, time.Second)
		t.Logf("a record changed in kube-apiserver reached the open watch after %v", time.Since(start))
		if got := ev.Object.(*aggv1.CoderTemplate); ev.Type != watch.Modified || got.Annotations["note"] != "from another replica" {
			t.Errorf("watch event %s annotations %v; want MODIFIED with the note", ev.Type, got.Annotations)
		}
	})

	t.Run("generation counts spec changes", func(t *testing.T) {
		before := ms.getTemplate(t, name)
		out, err := ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Spec.DisplayName = "Changed in Kubernetes" })
		if err != nil {
			t.Fatal(err)
		}
		checkGeneration(t, out, before.Generation+1)
		if out.Labels["env"] != "prod" {
			t.Errorf("a spec change lost the labels: %v", out.Labels)
		}
		// A change made in Coder counts too, and the poller records it.
		tpl, err := ms.coder.Client.TemplateByName(ms.ctx, ms.coder.OrganizationID, "alpha")
		if err != nil {
			t.Fatal(err)
		}
		req := coderapi.TemplateMeta(&tpl)
		desc := "changed in Coder"
		req.Description = &desc
		if _, err := ms.coder.Client.UpdateTemplateMeta(ms.ctx, tpl.ID, req); err != nil {
			t.Fatal(err)
		}
		got := ms.getTemplate(t, name)
		checkGeneration(t, got, out.Generation+1)
		if _, err := ms.tpls.List(ms.ctx, &metainternalversion.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the record counts the change made in Coder", func() bool {
			r := ms.record(t, got, coderv1alpha1.RecordResourceTemplates)
			return r.Spec.Generation == out.Generation+1 && r.Spec.SpecHash == specHashOf(got)
		})
		checkGeneration(t, ms.getTemplate(t, name), out.Generation+1)
	})

	t.Run("finalizers hold a delete", func(t *testing.T) {
		if _, err := ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Finalizers = []string{"example.com/hold"} }); err != nil {
			t.Fatal(err)
		}
		out, deleted, err := ms.tpls.Delete(ms.ctx, name, nil, &metav1.DeleteOptions{})
		if err != nil || deleted {
			t.Fatalf("delete: deleted %v, %v", deleted, err)
		}
		held := out.(*aggv1.CoderTemplate)
		if held.DeletionTimestamp == nil || len(held.Finalizers) != 1 {
			t.Fatalf("held delete returned deletionTimestamp %v finalizers %v", held.DeletionTimestamp, held.Finalizers)
		}
		if _, err := ms.coder.Client.TemplateByName(ms.ctx, ms.coder.OrganizationID, "alpha"); err != nil {
			t.Fatalf("the held delete reached Coder: %v", err)
		}
		if got := ms.getTemplate(t, name); got.DeletionTimestamp == nil || !got.DeletionTimestamp.Equal(held.DeletionTimestamp) {
			t.Errorf("GET shows deletionTimestamp %v, want %v", got.DeletionTimestamp, held.DeletionTimestamp)
		}
		_, err = ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Finalizers = append(o.Finalizers, "example.com/another") })
		if !apierrors.IsInvalid(err) {
			t.Errorf("adding a finalizer while deleting: %v, want 422", err)
		}
		if _, err := ms.updateTemplate(t, name, false, func(o *aggv1.CoderTemplate) { o.Finalizers = nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := ms.coder.Client.TemplateByName(ms.ctx, ms.coder.OrganizationID, "alpha"); coderapi.StatusCode(err) != 404 {
			t.Fatalf("after the last finalizer went, Coder still has the template: %v", err)
		}
		if _, err := ms.tpls.Get(ms.ctx, name, &metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("GET after the released delete: %v, want 404", err)
		}
		if r := ms.record(t, created, coderv1alpha1.RecordResourceTemplates); r != nil {
			t.Errorf("the record outlived the template")
		}
	})

	t.Run("records of objects gone from Coder are deleted", func(t *testing.T) {
		old := cleanupGrace
		cleanupGrace = 0
		t.Cleanup(func() { cleanupGrace = old })
		ms.version = ms.buildVersion(t) // a version belongs to one template
		gone := ms.createTemplate(t, "gamma", metav1.ObjectMeta{Labels: map[string]string{"team": "c"}}, false)
		if ms.record(t, gone, coderv1alpha1.RecordResourceTemplates) == nil {
			t.Fatal("no record")
		}
		if err := ms.coder.Client.DeleteTemplate(ms.ctx, uuid.MustParse(gone.Status.ID)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // the record's creationTimestamp has second precision
		if _, err := ms.tpls.List(ms.ctx, &metainternalversion.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the record is deleted", func() bool { return ms.record(t, gone, coderv1alpha1.RecordResourceTemplates) == nil })
	})

	// A delete's record can change or go between the delete's read of it
	// and its own delete of it: a promoter, upkeep or another replica
	// wrote it. The delete still succeeds and leaves no record. (A record
	// changed and then deleted in the moment between the two is answered
	// as gone by waitNewer; no test can time that moment.)
	t.Run("a delete's record changed or deleted meanwhile", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			other func(t *testing.T, rec *records.Record)
		}{
			{"epsilon", func(t *testing.T, rec *records.Record) {
				rec.Spec.Labels["team"] = "changed"
				if err := ms.kube.Update(ms.ctx, rec); err != nil {
					t.Fatal(err)
				}
			}},
			{"zeta", func(t *testing.T, rec *records.Record) {
				if err := ms.kube.Delete(ms.ctx, rec); err != nil {
					t.Fatal(err)
				}
			}},
		} {
			ms.version = ms.buildVersion(t)
			obj := ms.createTemplate(t, tc.name, metav1.ObjectMeta{Labels: map[string]string{"team": "e"}}, false)
			ts, err := ms.tpls.targets(ms.ctx, metaNS)
			if err != nil {
				t.Fatal(err)
			}
			w, err := ms.tpls.beginWrite(ms.ctx, ts[0], obj)
			if err != nil || w.prev == nil {
				t.Fatalf("%s: the delete's read of the record: %v, record %v", tc.name, err, w.prev)
			}
			tc.other(t, ms.record(t, obj, coderv1alpha1.RecordResourceTemplates))
			if err := w.forget(ms.ctx); err != nil {
				t.Errorf("%s: forgetting the record: %v, want nil", tc.name, err)
			}
			if rec := ms.record(t, obj, coderv1alpha1.RecordResourceTemplates); rec != nil {
				t.Errorf("%s: the record is left at version %s", tc.name, rec.ResourceVersion)
			}
		}
	})

	t.Run("workspace: labels, generation, finalizer-held delete", func(t *testing.T) {
		tpl, err := ms.coder.PushTemplate(ms.ctx, "ws-base", testenv.ProviderFreeTemplate())
		if err != nil {
			t.Fatal(err)
		}
		ws, err := ms.coder.CreateWorkspace(ms.ctx, tpl.Name, "dev")
		if err != nil {
			t.Fatal(err)
		}
		wname := ms.org + "." + ws.OwnerName + ".dev"
		cur, err := ms.wss.Get(ms.ctx, wname, &metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next := cur.(*aggv1.CoderWorkspace).DeepCopy()
		checkGeneration(t, next, 1)
		next.Labels["team"] = "w"
		next.Labels[aggv1.LabelOwner] = "mallory"
		if _, _, err := ms.wss.Update(ms.ctx, wname, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Fatalf("setting the owner label: %v, want 422", err)
		}
		next.Labels[aggv1.LabelOwner] = ws.OwnerName
		out, _, err := ms.wss.Update(ms.ctx, wname, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var deleted bool
		if got := out.(*aggv1.CoderWorkspace); got.Labels["team"] != "w" || got.ResourceVersion == cur.(*aggv1.CoderWorkspace).ResourceVersion {
			t.Errorf("workspace after the label change: labels %v rv %s", got.Labels, got.ResourceVersion)
		}
		l, err := ms.wss.List(ms.ctx, &metainternalversion.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if items := l.(*workspaceList).Items; len(items) != 1 || items[0].Labels["team"] != "w" {
			t.Errorf("LIST = %+v, want the workspace with team=w", items)
		}

		update := func(change func(*aggv1.CoderWorkspace)) *aggv1.CoderWorkspace {
			t.Helper()
			cur, err := ms.wss.Get(ms.ctx, wname, &metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			next := cur.(*aggv1.CoderWorkspace).DeepCopy()
			change(next)
			out, _, err := ms.wss.Update(ms.ctx, wname, rest.DefaultUpdatedObjectInfo(next), nil, nil, false, &metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return out.(*aggv1.CoderWorkspace)
		}
		// A spec change through Kubernetes counts.
		ttl := int64(2 * time.Hour / time.Millisecond)
		checkGeneration(t, update(func(w *aggv1.CoderWorkspace) { w.Spec.TTLMillis = &ttl }), 2)

		// Finalizers hold the delete: no delete build until they are gone.
		update(func(w *aggv1.CoderWorkspace) { w.Finalizers = []string{"example.com/hold"} })
		out, deleted, err = ms.wss.Delete(ms.ctx, wname, nil, &metav1.DeleteOptions{})
		if err != nil || deleted || out.(*aggv1.CoderWorkspace).DeletionTimestamp == nil {
			t.Fatalf("held delete: deleted %v, %v, object %+v", deleted, err, out)
		}
		if w, err := ms.coder.Client.Workspace(ms.ctx, ws.ID); err != nil || w.LatestBuild.Transition == codersdk.WorkspaceTransitionDelete {
			t.Fatalf("the held delete reached Coder: %v, latest build %s", err, w.LatestBuild.Transition)
		}
		released := update(func(w *aggv1.CoderWorkspace) { w.Finalizers = nil })
		if released.DeletionTimestamp == nil {
			t.Errorf("after the finalizer went, the workspace shows no deletionTimestamp")
		}
		if w, err := ms.coder.Client.Workspace(ms.ctx, ws.ID); err != nil || w.LatestBuild.Transition != codersdk.WorkspaceTransitionDelete {
			t.Fatalf("after the last finalizer went, no delete build: %v, latest build %s", err, w.LatestBuild.Transition)
		}
	})
}

// checkGeneration checks metadata.generation and that the status and
// every condition describe it.
func checkGeneration(t *testing.T, o runtime.Object, want int64) {
	t.Helper()
	var gen, observed int64
	var conds []metav1.Condition
	switch v := o.(type) {
	case *aggv1.CoderTemplate:
		gen, observed, conds = v.Generation, v.Status.ObservedGeneration, v.Status.Conditions
	case *aggv1.CoderWorkspace:
		gen, observed, conds = v.Generation, v.Status.ObservedGeneration, v.Status.Conditions
	}
	if gen != want || observed != want {
		t.Errorf("generation %d, observedGeneration %d; want %d", gen, observed, want)
	}
	for _, c := range conds {
		if c.ObservedGeneration != want {
			t.Errorf("condition %s observedGeneration %d; want %d", c.Type, c.ObservedGeneration, want)
		}
	}
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMergeRecord checks the merge of Coder's view with a record: derived
// labels win, merging again changes nothing, no record means Coder's view
// alone, and a spec changed in Coder counts as the next generation.
func TestMergeRecord(t *testing.T) {
	tgt := fxTarget(t, "prod", false)
	base := toWorkspace(tgt, fxWorkspace(), nil)
	del := metav1.NewTime(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	rec := &records.Record{Spec: coderv1alpha1.CoderObjectRecordSpec{
		Generation: 4, SpecHash: specHashOf(base),
		Labels:      map[string]string{"team": "a", aggv1.LabelOwner: "mallory"},
		Annotations: map[string]string{"note": "x"}, Finalizers: []string{"example.com/hold", FinalizerDeleteBuild},
		DeletionTimestamp: &del,
	}}
	obj := base.DeepCopy()
	if mergeRecord(obj, rec) {
		t.Error("a spec change in Coder reported for an unchanged spec")
	}
	want := map[string]string{"team": "a", aggv1.LabelOwner: "alice", aggv1.LabelOrganization: "acme", aggv1.LabelTemplate: "docker", aggv1.LabelControlPlane: "prod"}
	if !apiequality.Semantic.DeepEqual(obj.Labels, want) {
		t.Errorf("labels = %v, want %v", obj.Labels, want)
	}
	if !apiequality.Semantic.DeepEqual(obj.Finalizers, []string{"example.com/hold"}) || obj.DeletionTimestamp == nil || !obj.DeletionTimestamp.Equal(&del) ||
		obj.Annotations["note"] != "x" || !apiequality.Semantic.DeepEqual(obj.ManagedFields, coderdOwnsStatus()) {
		t.Errorf("merged metadata = finalizers %v, deletionTimestamp %v, annotations %v, managedFields %v", obj.Finalizers, obj.DeletionTimestamp, obj.Annotations, obj.ManagedFields)
	}
	checkGeneration(t, obj, 4)
	again := obj.DeepCopy()
	mergeRecord(again, rec)
	if !apiequality.Semantic.DeepEqual(again, obj) {
		t.Errorf("merging twice changed the object:\n%+v\n%+v", obj, again)
	}
	// Without a record: Coder's view alone.
	mergeRecord(again, nil)
	base.Generation = 1
	setObservedGeneration(base, 1)
	if !apiequality.Semantic.DeepEqual(again, base) {
		t.Errorf("merging with no record:\n%+v\nwant\n%+v", again, base)
	}
	// A spec changed in Coder is the next generation.
	changed := toWorkspace(tgt, fxWorkspace(), nil)
	changed.Spec.Running = !changed.Spec.Running
	if !mergeRecord(changed, rec) {
		t.Error("a spec change in Coder was not reported")
	}
	checkGeneration(t, changed, 5)
	// A delete build keeps its own deletionTimestamp and finalizer.
	deleting := toWorkspace(tgt, fxWorkspace(), nil)
	ts := metav1.NewTime(fxBuildQueued.Truncate(time.Second))
	deleting.DeletionTimestamp, deleting.Finalizers = &ts, []string{FinalizerDeleteBuild}
	mergeRecord(deleting, rec)
	if !deleting.DeletionTimestamp.Equal(&ts) || !apiequality.Semantic.DeepEqual(deleting.Finalizers, []string{"example.com/hold", FinalizerDeleteBuild}) {
		t.Errorf("deleting workspace: deletionTimestamp %v finalizers %v", deleting.DeletionTimestamp, deleting.Finalizers)
	}
}

// readyOf is what a template's Ready condition says, without the parts
// that name the version (a dry run creates none).
func readyOf(o *aggv1.CoderTemplate) string {
	c := readyCondition(o)
	return string(c.Status) + " " + c.Reason
}
