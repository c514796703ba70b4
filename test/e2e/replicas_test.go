package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
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

// replicaLabel is the label the test sets with kubectl.
const replicaLabel = "replicas.e2e/step"

// TestReplicas is issue 29: the chart's HA setup puts two replicas of the
// aggregated API server behind one Service, each polling coderd on its
// own. A client-go reflector whose LIST always goes to replica A and
// whose WATCH always goes to replica B follows workspaces started,
// stopped, labelled and deleted in Coder and through kubectl: its store
// always comes to equal coderd's state, and a workspace it saw deleted
// never comes back. It does so because B answers a watch from A's
// resourceVersion with 410 Gone (reason Expired) and the reflector lists
// again, which the test counts: B cannot know what A's version has seen.
//
// The reflector starts when B has counted a change that A has not polled
// yet, and A's latest version is newer than B's count of it (a write went
// through A since): had B taken A's version for "now", as it did before
// issue 29, the reflector would never see that change. An update whose
// resourceVersion precondition A handed out is checked on B by content.
func TestReplicas(t *testing.T) {
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
	waitOperatorAccess(t, s, s.ns, "coder", s.coderURL(), 90*time.Second)
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
	labels := map[string]string{} // Coder workspace name -> replicaLabel's value

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
	labels["ws-2"] = "one"

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
			s.waitStoreMatches(t, store, lw, labels)
			t.Logf("the reflector's store matched coderd %s after the change (%s)", time.Since(began).Round(time.Millisecond), lw.summary())
			for _, name := range gone {
				store.forbid(s.ns + "/" + s.workspaceName(name))
			}
		})
	}

	step("a change B counted before A, listed on A and watched on B", func(t *testing.T) {})
	step("start in Coder", func(t *testing.T) { s.coderTransition(t, "ws-1", codersdk.WorkspaceTransitionStart) })
	step("stop with kubectl", func(t *testing.T) {
		s.must(t, "patch", "cws", s.workspaceName("ws-2"), "-n", s.ns, "--type=merge", "-p", `{"spec":{"running":false}}`)
		s.waitLatestBuild(t, "ws-2", codersdk.WorkspaceTransitionStop)
	})
	step("delete in Coder", func(t *testing.T) {
		s.coderTransition(t, "ws-3", codersdk.WorkspaceTransitionDelete)
	}, "ws-3")
	step("create in Coder", func(t *testing.T) {
		if _, err := s.coder.CreateWorkspace(ctx, "base", "ws-4"); err != nil {
			t.Fatal(err)
		}
	})
	step("relabel with kubectl", func(t *testing.T) {
		s.must(t, "label", "--overwrite", "cws", s.workspaceName("ws-2"), "-n", s.ns, replicaLabel+"=two")
		s.must(t, "label", "cws", s.workspaceName("ws-4"), "-n", s.ns, replicaLabel+"=four")
		labels["ws-2"], labels["ws-4"] = "two", "four"
	})
	step("delete with kubectl", func(t *testing.T) {
		s.must(t, "delete", "cws", s.workspaceName("ws-2"), "-n", s.ns, "--wait=false")
		delete(labels, "ws-2")
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

// workspaceState is what the test compares of a workspace: its latest
// build and the label the test sets.
type workspaceState struct {
	transition, jobStatus, label string
}

// waitStoreMatches waits until the reflector's store holds exactly
// coderd's workspaces of the first user, each with coderd's latest build
// and the label the test set (labels, by Coder workspace name), and no
// workspace deleted before has come back.
func (s *aggStack) waitStoreMatches(t *testing.T, store *replicaStore, lw *splitListWatch, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	var last string
	deadline := time.Now().Add(90 * time.Second)
	for {
		res, err := s.coder.Client.Workspaces(ctx, codersdk.WorkspaceFilter{Owner: s.coder.Username})
		if err != nil {
			t.Fatalf("coderd: list workspaces: %v", err)
		}
		want := map[string]workspaceState{}
		for _, w := range res.Workspaces {
			want[s.ns+"/"+s.workspaceName(w.Name)] = workspaceState{
				transition: string(w.LatestBuild.Transition), jobStatus: string(w.LatestBuild.Job.Status), label: labels[w.Name],
			}
		}
		got := map[string]workspaceState{}
		for _, obj := range store.List() {
			u := obj.(*unstructured.Unstructured)
			transition, _, _ := unstructured.NestedString(u.Object, "status", "latestBuild", "transition")
			jobStatus, _, _ := unstructured.NestedString(u.Object, "status", "latestBuild", "jobStatus")
			got[u.GetNamespace()+"/"+u.GetName()] = workspaceState{transition: transition, jobStatus: jobStatus, label: u.GetLabels()[replicaLabel]}
		}
		last = stateDiff(want, got)
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

// stateDiff lists how got differs from want, "" when it does not.
func stateDiff(want, got map[string]workspaceState) string {
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	var diffs []string
	for k := range keys {
		w, inWant := want[k]
		g, inGot := got[k]
		switch {
		case !inGot:
			diffs = append(diffs, fmt.Sprintf("%s: missing from the store (coderd: %+v)", k, w))
		case !inWant:
			diffs = append(diffs, fmt.Sprintf("%s: in the store (%+v) but not in coderd", k, g))
		case w != g:
			diffs = append(diffs, fmt.Sprintf("%s: store %+v, coderd %+v", k, g, w))
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
