package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// replicaLabel and replicaAnnotation are the metadata the test sets with
// kubectl.
const (
	replicaLabel      = "replicas.e2e/step"
	replicaAnnotation = "replicas.e2e/note"
)

// replicaControlPlane is the stack's CoderControlPlane: its name is a
// derived label of every workspace.
const replicaControlPlane = "coder"

// TestReplicas is issue 29: the chart's HA setup puts two replicas of the
// aggregated API server behind one Service, each polling coderd on its
// own. A client-go reflector whose LIST always goes to replica A and
// whose WATCH always goes to replica B follows workspaces started,
// stopped, labelled and deleted in Coder and through kubectl: after each
// change its store comes to hold exactly coderd's workspaces, each equal
// to coderd's state in every field the object derives from it (a second
// build of the same transition included) and in all its labels and
// annotations, and a workspace it saw deleted never comes back. It does
// so because B answers a watch from A's resourceVersion with 410 Gone
// (reason Expired) and the reflector lists again, which the test counts:
// B cannot know what A's version has seen.
//
// The reflector starts when B has counted a change that A has not polled
// yet, and A's latest version is newer than B's count of it (a write went
// through A since): had B taken A's version for "now", as it did before
// issue 29, the reflector would never see that change. An update whose
// resourceVersion precondition A handed out is checked on B by content.
func TestReplicas(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// Polls 20s apart, so that the test can place each replica's polls.
	const interval = 20 * time.Second
	s := newStack(t, withoutOperator(), withPollInterval(interval))
	ctx := context.Background()
	// Two processes of the shipped binary, as the chart runs them: one
	// leader Lease, every replica serving the aggregated API.
	opts := OperatorOptions{LeaseName: "coder-k8s-replicas"}
	a := s.startOperator(t, opts)
	b := s.startOperator(t, opts)
	s.op = a // kubectl's requests, through kube-apiserver, go to A
	s.routeAPIService(t, a)
	waitOperatorAccess(t, s, s.ns, replicaControlPlane, s.coderURL(), 90*time.Second)
	if _, err := s.coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ws-1", "ws-2", "ws-3"} {
		if _, err := s.coder.CreateWorkspace(ctx, "base", name); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("stack, two replicas and three workspaces up in %s", time.Since(start).Round(time.Millisecond))

	// The caller, as kube-apiserver's front proxy presents the cluster
	// admin to an aggregated API server: admin is mapped to coderd's
	// owner.
	dynA := replicaClient(t, s, a)
	dynB := replicaClient(t, s, b)
	meta := map[string]userMeta{} // by Coder workspace name

	// Other clients watch each replica, so both poll: B first, A about
	// 8s later (a replica polls when its first watcher arrives, then
	// every interval).
	onB := startReplicaWatch(t, dynB, s.ns, "B", 3)
	time.Sleep(8 * time.Second)
	onA := startReplicaWatch(t, dynA, s.ns, "A", 3)
	// A change that B's next poll counts, 8s before A's next poll sees
	// it; then a write through A, which A counts at once.
	ws1 := s.workspaceName("ws-1")
	s.coderTransition(t, "ws-1", codersdk.WorkspaceTransitionStop)
	onB.waitBuild(t, ws1, codersdk.WorkspaceTransitionStop, interval+10*time.Second)
	if onA.sawBuild(ws1, codersdk.WorkspaceTransitionStop) {
		t.Fatalf("replica A polled the stop of ws-1 as early as B: the test's timing assumption (A polls %s after B) does not hold", 8*time.Second)
	}
	s.must(t, "label", "cws", s.workspaceName("ws-2"), "-n", s.ns, replicaLabel+"=one")
	meta["ws-2"] = userMeta{labels: map[string]string{replicaLabel: "one"}}

	lw := &splitListWatch{
		list:  dynA.Resource(workspacesGVR).Namespace(s.ns),
		watch: dynB.Resource(workspacesGVR).Namespace(s.ns),
		fromA: map[string]bool{},
	}
	store := &replicaStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc), gone: map[string]bool{}}
	example := &unstructured.Unstructured{}
	example.SetGroupVersionKind(aggv1.SchemeGroupVersion.WithKind("CoderWorkspace"))
	r := cache.NewReflectorWithOptions(lw, example, store, cache.ReflectorOptions{
		Name: "replicas",
		// Quick retries keep the test short; client-go's default backs
		// off to 30s between relists.
		Backoff: &wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Cap: time.Second, Steps: 4, Jitter: 0.1},
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.RunWithContext(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	// step makes a change and waits until the reflector's store shows
	// it; the workspaces named gone, deleted by the change, must never
	// come back into the store once it has let them go.
	step := func(what string, change func(t *testing.T), gone ...string) {
		t.Helper()
		t.Run(what, func(t *testing.T) {
			change(t)
			began := time.Now()
			s.waitStoreMatches(t, store, lw, meta)
			t.Logf("the reflector's store matched coderd %s after the change (%s)", time.Since(began).Round(time.Millisecond), lw.summary())
			for _, name := range gone {
				store.forbid(s.ns + "/" + s.workspaceName(name))
			}
		})
	}

	step("a change B counted before A, listed on A and watched on B", func(t *testing.T) {})
	step("start in Coder", func(t *testing.T) { s.coderTransition(t, "ws-1", codersdk.WorkspaceTransitionStart) })
	// A second start build: only the latest build's ID, number and times
	// tell it from the first.
	step("start again in Coder", func(t *testing.T) { s.coderTransition(t, "ws-1", codersdk.WorkspaceTransitionStart) })
	step("stop with kubectl", func(t *testing.T) {
		s.must(t, "patch", "cws", s.workspaceName("ws-2"), "-n", s.ns, "--type=merge", "-p", `{"spec":{"running":false}}`)
		s.waitLatestBuild(t, "ws-2", codersdk.WorkspaceTransitionStop)
	})
	step("start with kubectl", func(t *testing.T) {
		s.must(t, "patch", "cws", s.workspaceName("ws-2"), "-n", s.ns, "--type=merge", "-p", `{"spec":{"running":true}}`)
		s.waitLatestBuild(t, "ws-2", codersdk.WorkspaceTransitionStart)
	})
	step("delete in Coder", func(t *testing.T) {
		s.coderTransition(t, "ws-3", codersdk.WorkspaceTransitionDelete)
	}, "ws-3")
	step("create in Coder", func(t *testing.T) {
		if _, err := s.coder.CreateWorkspace(ctx, "base", "ws-4"); err != nil {
			t.Fatal(err)
		}
	})
	step("relabel and annotate with kubectl", func(t *testing.T) {
		s.must(t, "label", "--overwrite", "cws", s.workspaceName("ws-2"), "-n", s.ns, replicaLabel+"=two")
		s.must(t, "label", "cws", s.workspaceName("ws-4"), "-n", s.ns, replicaLabel+"=four")
		s.must(t, "annotate", "cws", s.workspaceName("ws-4"), "-n", s.ns, replicaAnnotation+"=four")
		meta["ws-2"] = userMeta{labels: map[string]string{replicaLabel: "two"}}
		meta["ws-4"] = userMeta{labels: map[string]string{replicaLabel: "four"}, annotations: map[string]string{replicaAnnotation: "four"}}
	})
	step("delete with kubectl", func(t *testing.T) {
		s.must(t, "delete", "cws", s.workspaceName("ws-2"), "-n", s.ns, "--wait=false")
		delete(meta, "ws-2")
		testenv.WaitFor(t, 2*time.Minute, func() error {
			if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-2", codersdk.WorkspaceOptions{}); err == nil {
				return errNotYet("coderd still has ws-2")
			}
			return nil
		})
	}, "ws-2")

	t.Run("the watches on B from A's versions got 410 and the reflector listed again", func(t *testing.T) {
		st := lw.stats()
		if st.expired == 0 || st.lists < 2 {
			t.Fatalf("%s: want every watch on B refused with 410 Expired and a LIST on A after each", lw.summary())
		}
		if st.watchesFromA != st.expired || st.started != 0 {
			t.Errorf("%s: want each watch on B from a version A issued refused (410), none started", lw.summary())
		}
		if !strings.Contains(st.lastExpired, "another replica") {
			t.Errorf("B's 410 does not say the version came from another replica: %q", st.lastExpired)
		}
		if back := store.resurrected(); len(back) > 0 {
			t.Errorf("deleted workspaces came back into the reflector's store: %v", back)
		}
	})

	t.Run("B's own version resumes on B", func(t *testing.T) {
		l, err := dynB.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := dynB.Resource(workspacesGVR).Namespace(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
		if err != nil {
			t.Fatalf("watch on B from B's list version %q: %v", l.GetResourceVersion(), err)
		}
		w.Stop()
	})

	t.Run("an update on B with A's resourceVersion is checked by content", func(t *testing.T) {
		res := dynA.Resource(workspacesGVR).Namespace(s.ns)
		name := s.workspaceName("ws-1")
		fromA, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stale := fromA.DeepCopy()
		// A's object, unchanged since: B applies the update.
		next := fromA.DeepCopy()
		setLabel(next, replicaLabel, "one")
		updated, err := dynB.Resource(workspacesGVR).Namespace(s.ns).Update(ctx, next, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("update on B with A's resourceVersion %q of unchanged content: %v", fromA.GetResourceVersion(), err)
		}
		if updated.GetLabels()[replicaLabel] != "one" {
			t.Errorf("the update on B did not set the label: %v", updated.GetLabels())
		}
		// A's version from before that change: B refuses it.
		setLabel(stale, replicaLabel, "stale")
		_, err = dynB.Resource(workspacesGVR).Namespace(s.ns).Update(ctx, stale, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			t.Errorf("update on B with A's resourceVersion %q of content changed since: %v, want 409 Conflict", stale.GetResourceVersion(), err)
		}
	})
}

// replicaWatch is another client's watch on one replica, from the current
// state.
type replicaWatch struct {
	replica string
	mu      sync.Mutex
	// latest is each workspace's latest state the watch delivered.
	latest map[string]*unstructured.Unstructured
}

// startReplicaWatch watches namespace ns's workspaces on one replica and
// waits for the initial events of n workspaces.
func startReplicaWatch(t *testing.T, dyn dynamic.Interface, ns, replica string, n int) *replicaWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := dyn.Resource(workspacesGVR).Namespace(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("watch on replica %s: %v", replica, err)
	}
	rw := &replicaWatch{replica: replica, latest: map[string]*unstructured.Unstructured{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Bookmark || ev.Type == watch.Error {
				continue
			}
			rw.mu.Lock()
			rw.latest[u.GetName()] = u
			rw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	testenv.WaitFor(t, 30*time.Second, func() error {
		rw.mu.Lock()
		defer rw.mu.Unlock()
		if len(rw.latest) < n {
			return errNotYet(fmt.Sprintf("the watch on replica %s delivered %d of %d workspaces", replica, len(rw.latest), n))
		}
		return nil
	})
	return rw
}

// sawBuild reports whether the watch delivered workspace name with a
// finished latest build of transition.
func (rw *replicaWatch) sawBuild(name string, transition codersdk.WorkspaceTransition) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	u := rw.latest[name]
	if u == nil {
		return false
	}
	tr, _, _ := unstructured.NestedString(u.Object, "status", "latestBuild", "transition")
	job, _, _ := unstructured.NestedString(u.Object, "status", "latestBuild", "jobStatus")
	return tr == string(transition) && job == string(codersdk.ProvisionerJobSucceeded)
}

// waitBuild waits until the watch delivered workspace name with a
// finished latest build of transition.
func (rw *replicaWatch) waitBuild(t *testing.T, name string, transition codersdk.WorkspaceTransition, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, func() error {
		if !rw.sawBuild(name, transition) {
			return errNotYet(fmt.Sprintf("the watch on replica %s has not delivered %s with its %s build succeeded", rw.replica, name, transition))
		}
		return nil
	})
}

func setLabel(u *unstructured.Unstructured, key, value string) {
	l := u.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[key] = value
	u.SetLabels(l)
}

// replicaClient talks to op's aggregated API server directly, as
// kube-apiserver's front proxy does: its client certificate, which op
// trusts through the requestheader CA, and the cluster admin's user and
// groups in X-Remote-* headers.
func replicaClient(t *testing.T, s *aggStack, op *Operator) dynamic.Interface {
	t.Helper()
	cfg := &rest.Config{
		Host: op.Aggregated,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   s.caPEM,
			CertFile: filepath.Join(s.k.Dir, "front-proxy-client.crt"),
			KeyFile:  filepath.Join(s.k.Dir, "front-proxy-client.key"),
		},
		QPS: 50, Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return &testenv.HeaderTransport{Next: rt, Header: http.Header{
				"X-Remote-User":  {"admin"},
				"X-Remote-Group": {"system:masters", "system:authenticated"},
			}}
		},
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// splitListWatch lists on one replica and watches on another, and counts
// what each answered.
type splitListWatch struct {
	list, watch dynamic.ResourceInterface

	mu sync.Mutex
	// fromA holds the list resourceVersions A answered.
	fromA        map[string]bool
	lists        int
	watchesFromA int
	expired      int
	started      int
	lastExpired  string
	otherErrs    []string
}

var _ cache.ListerWatcher = (*splitListWatch)(nil)

// IsWatchListSemanticsUnSupported makes the reflector LIST and then WATCH
// rather than stream the list over a watch (client-go's WatchListClient),
// so that its lists go to A.
func (l *splitListWatch) IsWatchListSemanticsUnSupported() bool { return true }

func (l *splitListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	out, err := l.list.List(context.Background(), opts)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.otherErrs = append(l.otherErrs, fmt.Sprintf("LIST at %q: %v", opts.ResourceVersion, err))
		return nil, err
	}
	l.lists++
	l.fromA[out.GetResourceVersion()] = true
	return out, nil
}

func (l *splitListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	w, err := l.watch.Watch(context.Background(), opts)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fromA[opts.ResourceVersion] {
		l.watchesFromA++
	}
	switch {
	case apierrors.IsResourceExpired(err):
		l.expired++
		l.lastExpired = err.Error()
	case err != nil:
		l.otherErrs = append(l.otherErrs, fmt.Sprintf("WATCH from %q: %v", opts.ResourceVersion, err))
	default:
		l.started++
	}
	return w, err
}

type splitStats struct {
	lists, watchesFromA, expired, started int
	lastExpired                           string
}

func (l *splitListWatch) stats() splitStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return splitStats{lists: l.lists, watchesFromA: l.watchesFromA, expired: l.expired, started: l.started, lastExpired: l.lastExpired}
}

func (l *splitListWatch) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := fmt.Sprintf("%d LISTs on A, %d WATCHes on B from A's versions: %d refused 410 Expired, %d started", l.lists, l.watchesFromA, l.expired, l.started)
	if n := len(l.otherErrs); n > 0 {
		s += fmt.Sprintf("; %d other errors, the last: %s", n, l.otherErrs[n-1])
	}
	return s
}

// replicaStore is the reflector's store; it records every workspace it
// takes in after the test saw it deleted for good.
type replicaStore struct {
	cache.Store

	mu   sync.Mutex
	gone map[string]bool
	back []string
}

// forbid marks key deleted in coderd: the store must never hold it again.
func (s *replicaStore) forbid(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone[key] = true
}

func (s *replicaStore) check(obj any) {
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone[key] {
		s.back = append(s.back, key)
	}
}

func (s *replicaStore) Add(obj any) error {
	s.check(obj)
	return s.Store.Add(obj)
}

func (s *replicaStore) Update(obj any) error {
	s.check(obj)
	return s.Store.Update(obj)
}

func (s *replicaStore) Replace(list []any, rv string) error {
	for _, obj := range list {
		s.check(obj)
	}
	return s.Store.Replace(list, rv)
}

func (s *replicaStore) resurrected() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.back...)
}

// userMeta is the metadata the test set with kubectl on one workspace:
// coderd does not keep it, so the test's record of it is what the store
// must show.
type userMeta struct {
	labels, annotations map[string]string
}

// workspaceFields is what a user reads of one workspace, by field path:
// every field the aggregated object derives from coderd, and all its
// labels and annotations. Two builds of the same transition differ in
// their ID, number and times.
type workspaceFields map[string]string

// coderdFields is what the aggregated object of w must show: coderd's
// state, the labels derived from it, and meta.
func (s *aggStack) coderdFields(w codersdk.Workspace, meta userMeta) workspaceFields {
	b := w.LatestBuild
	labels := map[string]string{
		aggv1.LabelControlPlane: replicaControlPlane,
		aggv1.LabelOrganization: w.OrganizationName,
		aggv1.LabelOwner:        w.OwnerName,
		aggv1.LabelTemplate:     w.TemplateName,
	}
	for k, v := range meta.labels {
		labels[k] = v
	}
	f := workspaceFields{
		"metadata.uid":                           w.ID.String(),
		"metadata.creationTimestamp":             seconds(&w.CreatedAt),
		"metadata.labels":                        joinMap(labels),
		"metadata.annotations":                   joinMap(meta.annotations),
		"metadata.deletionTimestamp":             unset,
		"metadata.finalizers":                    "",
		"spec.organization":                      w.OrganizationName,
		"spec.templateName":                      w.TemplateName,
		"spec.templateVersionID":                 b.TemplateVersionID.String(),
		"spec.running":                           strconv.FormatBool(b.Transition == codersdk.WorkspaceTransitionStart),
		"spec.ttlMillis":                         int64String(w.TTLMillis),
		"spec.autostartSchedule":                 stringOrUnset(w.AutostartSchedule),
		"status.id":                              w.ID.String(),
		"status.owner":                           w.OwnerName,
		"status.ownerID":                         w.OwnerID.String(),
		"status.organization":                    w.OrganizationName,
		"status.organizationID":                  w.OrganizationID.String(),
		"status.template":                        w.TemplateName,
		"status.templateDisplayName":             w.TemplateDisplayName,
		"status.phase":                           string(b.Status),
		"status.outdated":                        strconv.FormatBool(w.Outdated),
		"status.healthy":                         strconv.FormatBool(w.Health.Healthy),
		"status.lastUsedAt":                      seconds(&w.LastUsedAt),
		"status.url":                             s.coderURL() + "/@" + w.OwnerName + "/" + w.Name,
		"status.autoShutdownDeadline":            unset,
		"status.latestBuild.id":                  b.ID.String(),
		"status.latestBuild.number":              strconv.Itoa(int(b.BuildNumber)),
		"status.latestBuild.transition":          string(b.Transition),
		"status.latestBuild.jobStatus":           string(b.Job.Status),
		"status.latestBuild.error":               b.Job.Error,
		"status.latestBuild.templateVersionID":   b.TemplateVersionID.String(),
		"status.latestBuild.templateVersionName": b.TemplateVersionName,
		"status.latestBuild.initiator":           b.InitiatorUsername,
		"status.latestBuild.createdAt":           seconds(&b.CreatedAt),
		"status.latestBuild.completedAt":         seconds(b.Job.CompletedAt),
	}
	if b.Deadline.Valid && b.Transition == codersdk.WorkspaceTransitionStart {
		f["status.autoShutdownDeadline"] = seconds(&b.Deadline.Time)
	}
	// A delete build that has not failed or been canceled shows as a
	// Kubernetes deletion held by coder-k8s' finalizer.
	if b.Transition == codersdk.WorkspaceTransitionDelete && b.Job.Status != codersdk.ProvisionerJobFailed && b.Job.Status != codersdk.ProvisionerJobCanceled {
		f["metadata.deletionTimestamp"] = seconds(&b.CreatedAt)
		f["metadata.finalizers"] = aggv1.GroupName + "/delete-build"
	}
	return f
}

// storeFields is what the aggregated object w shows in the same fields.
func storeFields(w *aggv1.CoderWorkspace) workspaceFields {
	f := workspaceFields{
		"metadata.uid":                string(w.UID),
		"metadata.creationTimestamp":  seconds(&w.CreationTimestamp.Time),
		"metadata.labels":             joinMap(w.Labels),
		"metadata.annotations":        joinMap(w.Annotations),
		"metadata.deletionTimestamp":  metaSeconds(w.DeletionTimestamp),
		"metadata.finalizers":         strings.Join(w.Finalizers, ","),
		"spec.organization":           w.Spec.Organization,
		"spec.templateName":           w.Spec.TemplateName,
		"spec.templateVersionID":      w.Spec.TemplateVersionID,
		"spec.running":                strconv.FormatBool(w.Spec.Running),
		"spec.ttlMillis":              int64String(w.Spec.TTLMillis),
		"spec.autostartSchedule":      stringOrUnset(w.Spec.AutostartSchedule),
		"status.id":                   w.Status.ID,
		"status.owner":                w.Status.Owner,
		"status.ownerID":              w.Status.OwnerID,
		"status.organization":         w.Status.Organization,
		"status.organizationID":       w.Status.OrganizationID,
		"status.template":             w.Status.Template,
		"status.templateDisplayName":  w.Status.TemplateDisplayName,
		"status.phase":                w.Status.Phase,
		"status.outdated":             strconv.FormatBool(w.Status.Outdated),
		"status.healthy":              strconv.FormatBool(w.Status.Healthy),
		"status.lastUsedAt":           metaSeconds(w.Status.LastUsedAt),
		"status.url":                  w.Status.URL,
		"status.autoShutdownDeadline": metaSeconds(w.Status.AutoShutdownDeadline),
	}
	b := w.Status.LatestBuild
	if b == nil {
		b = &aggv1.WorkspaceBuild{ID: unset}
	}
	f["status.latestBuild.id"] = b.ID
	f["status.latestBuild.number"] = strconv.Itoa(int(b.Number))
	f["status.latestBuild.transition"] = b.Transition
	f["status.latestBuild.jobStatus"] = b.JobStatus
	f["status.latestBuild.error"] = b.Error
	f["status.latestBuild.templateVersionID"] = b.TemplateVersionID
	f["status.latestBuild.templateVersionName"] = b.TemplateVersionName
	f["status.latestBuild.initiator"] = b.Initiator
	f["status.latestBuild.createdAt"] = seconds(&b.CreatedAt.Time)
	f["status.latestBuild.completedAt"] = metaSeconds(b.CompletedAt)
	return f
}

// unset stands for a field the object does not have.
const unset = "<unset>"

// seconds is a time as the API serializes it: UTC, whole seconds.
func seconds(t *time.Time) string {
	if t == nil || t.IsZero() {
		return unset
	}
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

func metaSeconds(t *metav1.Time) string {
	if t == nil {
		return unset
	}
	return seconds(&t.Time)
}

func int64String(p *int64) string {
	if p == nil {
		return unset
	}
	return strconv.FormatInt(*p, 10)
}

func stringOrUnset(p *string) string {
	if p == nil {
		return unset
	}
	return *p
}

// joinMap renders a map with sorted keys, so that maps compare as strings.
func joinMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// waitStoreMatches waits until the reflector's store holds exactly
// coderd's workspaces of the first user, by name, each showing coderd's
// state as coderd reports it in the same round (workspaceFields) and the
// metadata the test set (meta, by Coder workspace name), and no workspace
// deleted before has come back.
func (s *aggStack) waitStoreMatches(t *testing.T, store *replicaStore, lw *splitListWatch, meta map[string]userMeta) {
	t.Helper()
	ctx := context.Background()
	var last string
	deadline := time.Now().Add(90 * time.Second)
	for {
		res, err := s.coder.Client.Workspaces(ctx, codersdk.WorkspaceFilter{Owner: s.coder.Username})
		if err != nil {
			t.Fatalf("coderd: list workspaces: %v", err)
		}
		want := map[string]workspaceFields{}
		for _, w := range res.Workspaces {
			want[s.ns+"/"+s.workspaceName(w.Name)] = s.coderdFields(w, meta[w.Name])
		}
		got := map[string]workspaceFields{}
		for _, obj := range store.List() {
			u := obj.(*unstructured.Unstructured)
			var w aggv1.CoderWorkspace
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &w); err != nil {
				t.Fatalf("the reflector's store holds %s/%s, not a CoderWorkspace: %v", u.GetNamespace(), u.GetName(), err)
			}
			got[w.Namespace+"/"+w.Name] = storeFields(&w)
		}
		last = fieldsDiff(want, got)
		if back := store.resurrected(); len(back) > 0 {
			t.Fatalf("deleted workspaces came back into the reflector's store: %v (%s)", back, lw.summary())
		}
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reflector's store does not match coderd after 90s:\n%s\n%s\nreplica A log:\n%s", last, lw.summary(), s.op.LogTail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fieldsDiff lists how got differs from want, field by field, "" when it
// does not.
func fieldsDiff(want, got map[string]workspaceFields) string {
	var diffs []string
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s: missing from the store (coderd: build %s %s %s)", k, w["status.latestBuild.number"], w["status.latestBuild.transition"], w["status.latestBuild.jobStatus"]))
			continue
		}
		for field, wv := range w {
			if gv := g[field]; gv != wv {
				diffs = append(diffs, fmt.Sprintf("%s: %s: store %q, coderd %q", k, field, gv, wv))
			}
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: in the store (build %s %s %s) but not in coderd", k, g["status.latestBuild.number"], g["status.latestBuild.transition"], g["status.latestBuild.jobStatus"]))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "\n")
}

// coderTransition runs a build of workspace name in Coder (not through
// Kubernetes) and waits for it to succeed.
func (s *aggStack) coderTransition(t *testing.T, name string, transition codersdk.WorkspaceTransition) {
	t.Helper()
	ctx := context.Background()
	w := s.coderWorkspace(t, name)
	build, err := s.coder.Client.CreateWorkspaceBuild(ctx, w.ID, codersdk.CreateWorkspaceBuildRequest{Transition: transition})
	if err != nil {
		t.Fatalf("coderd: %s workspace %s: %v", transition, name, err)
	}
	if _, err := s.coder.WaitBuild(ctx, build.ID); err != nil {
		t.Fatalf("coderd: %s workspace %s: %v", transition, name, err)
	}
}

// waitLatestBuild waits until workspace name's latest build in coderd is a
// finished transition.
func (s *aggStack) waitLatestBuild(t *testing.T, name string, transition codersdk.WorkspaceTransition) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, func() error {
		w := s.coderWorkspace(t, name)
		if w.LatestBuild.Transition != transition || w.LatestBuild.Job.Status != codersdk.ProvisionerJobSucceeded {
			return errNotYet(fmt.Sprintf("%s: latest build %s %s, want %s succeeded", name, w.LatestBuild.Transition, w.LatestBuild.Job.Status, transition))
		}
		return nil
	})
}
