package storage

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// TestListAtAnotherReplicasVersion: two workspace storages over one real
// coderd, as two replicas of the API server behind one Service. A list at
// a replica's own resourceVersion is answered from its fresh cache; at the
// other replica's it reads coderd (never older than what the client saw);
// Exact at the other's is 410, and so is a watch from it.
func TestListAtAnotherReplicasVersion(t *testing.T) {
	const ns = "team-a"
	ps := newPollStack(t, 2, 0, time.Minute, ns)
	proxyA := ps.proxies[ns]
	proxyB := newFaultProxy(t, ps.coder.URL)
	wssB, err := NewWorkspaces(Options{Log: testr.New(t), PollInterval: time.Minute, Backends: fxProvider{backends: []backend.Backend{{
		Namespace: ns, URL: proxyB.URL, Client: coderapi.NewClient(proxyB.URL, ps.coder.SessionToken, 30*time.Second, coderapi.Target{}),
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { wssB.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ctx := genericapirequest.WithNamespace(context.Background(), ns)
	list := func(s *WorkspaceStorage, opts *metainternalversion.ListOptions) (*workspaceList, error) {
		t.Helper()
		obj, err := s.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		if n := len(obj.(*workspaceList).Items); n != 2 {
			t.Fatalf("LIST %+v: %d workspaces, want 2", opts, n)
		}
		return obj.(*workspaceList), nil
	}

	first, err := list(ps.wss, &metainternalversion.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rvA := first.ResourceVersion
	readsA := len(proxyA.requests())

	// A's own version, while A's cache is fresh: no coderd read.
	if _, err := list(ps.wss, &metainternalversion.ListOptions{ResourceVersion: rvA}); err != nil {
		t.Fatal(err)
	}
	if _, err := list(ps.wss, &metainternalversion.ListOptions{ResourceVersion: rvA, ResourceVersionMatch: metav1.ResourceVersionMatchExact}); err != nil {
		t.Fatalf("Exact at A's latest version on A: %v", err)
	}
	if n := len(proxyA.requests()); n != readsA {
		t.Errorf("lists on A at A's version read coderd %d times, want none", n-readsA)
	}

	// A's version on B: a consistent read of coderd, answered with B's
	// version.
	onB, err := list(wssB, &metainternalversion.ListOptions{ResourceVersion: rvA, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	if len(proxyB.requests()) == 0 {
		t.Error("a list on B at A's version was answered without reading coderd")
	}
	if onB.ResourceVersion == rvA {
		t.Errorf("B answered with A's version %q", rvA)
	}
	// B's own version is B's to continue from.
	if _, err := list(wssB, &metainternalversion.ListOptions{ResourceVersion: onB.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact}); err != nil {
		t.Errorf("Exact at B's latest version on B: %v", err)
	}

	for _, rv := range []string{rvA, "1700000000001999999"} {
		if _, err := list(wssB, &metainternalversion.ListOptions{ResourceVersion: rv, ResourceVersionMatch: metav1.ResourceVersionMatchExact}); !apierrors.IsResourceExpired(err) {
			t.Errorf("Exact at %q on B: %v, want 410 Expired", rv, err)
		}
		w, err := wssB.Watch(ctx, &metainternalversion.ListOptions{ResourceVersion: rv})
		if err == nil {
			w.Stop()
		}
		if !apierrors.IsResourceExpired(err) {
			t.Errorf("watch on B from %q: %v, want 410 Expired", rv, err)
		}
	}
}
