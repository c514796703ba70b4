package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/controller/controlplane"
	"github.com/coder/coder-k8s/internal/testenv"
)

// A user adopts an existing coderd with a CoderControlPlane; the running
// operator sets up its own user and token and reports it in status.
func TestAdoptExistingCoderd(t *testing.T) {
	t.Parallel()
	// newStack adopts the stack's coderd as coder/coder and waits for
	// operator access.
	s := newStack(t, withoutAPIService())
	ctx := context.Background()
	ccp := waitOperatorAccess(t, s, s.ns, "coder", s.coder.URL.String(), 60*time.Second)
	if ccp.Status.URL != s.coder.URL.String() || ccp.Status.ObservedGeneration != ccp.Generation {
		t.Errorf("status url=%q observedGeneration=%d (generation %d)", ccp.Status.URL, ccp.Status.ObservedGeneration, ccp.Generation)
	}

	t.Run("the token in the referenced Secret works", func(t *testing.T) {
		oc, err := coderapi.ForControlPlane(ctx, s.c, ccp, 5*time.Second, "e2e")
		if err != nil {
			t.Fatal(err)
		}
		me, err := oc.User(ctx, codersdk.Me)
		if err != nil {
			t.Fatalf("coderd rejects the operator token: %v", err)
		}
		if me.Username != ccp.Status.OperatorUser {
			t.Errorf("token user %q, status says %q", me.Username, ccp.Status.OperatorUser)
		}
	})

	t.Run("kubectl shows the access column", func(t *testing.T) {
		out, err := s.run("get", "ccp", "-n", s.ns)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1], s.coder.URL.String()) || !strings.Contains(lines[1], "True") {
			t.Errorf("kubectl get ccp:\n%s", out)
		}
	})
}

// A coderd that accepts connections and never answers holds each call for
// the full Coder request timeout, and the reconcile making it holds one of
// the controller's workers that long; other control planes must not wait
// for it while a worker is free, and never longer than that timeout.
func TestHungCoderdDoesNotBlockOthers(t *testing.T) {
	hung := startHungServer(t)
	s := newStack(t, withoutAPIService())
	// The operator runs with the defaults: this many CoderControlPlane
	// reconciles at once, each call to coderd bounded by this timeout.
	workers := controlplane.DefaultMaxConcurrentReconciles
	held := config.Default().Controller.CoderRequestTimeout.Duration
	hungURL := "http://" + hung.l.Addr().String()
	addHung := func(from, to int) {
		for i := from; i < to; i++ {
			createAdoptingControlPlane(t, s, s.ns, "hung-"+strconv.Itoa(i), hungURL, s.coder.SessionToken)
		}
	}
	// inFlight waits until at least n calls to the hung coderd are open,
	// each holding a worker.
	inFlight := func(n int) {
		t.Helper()
		testenv.WaitFor(t, 60*time.Second, func() error {
			if open := hung.open(); open < n {
				return errNotYet(fmt.Sprintf("%d calls to the hung coderd open, want %d", open, n))
			}
			return nil
		})
	}

	t.Run("every worker but one held by a hung coderd: a healthy control plane is served at once", func(t *testing.T) {
		addHung(0, workers-1)
		inFlight(workers - 1)
		start := time.Now()
		createAdoptingControlPlane(t, s, s.ns, "good-1", s.coder.URL.String(), s.coder.SessionToken)
		// Well inside the timeout the hung calls are held for.
		waitOperatorAccess(t, s, s.ns, "good-1", s.coder.URL.String(), held-10*time.Second)
		took := time.Since(start)
		// Every hung call was still open: the healthy control plane was
		// served while the others held their workers.
		if closed := hung.closed(); closed != 0 {
			t.Errorf("%d calls to the hung coderd ended before the healthy control plane was ready (after %s): the test proves nothing", closed, took)
		}
		t.Logf("healthy control plane ready after %s next to %d hung ones (%d workers)", took.Round(time.Millisecond), workers-1, workers)
	})
	if t.Failed() {
		return
	}

	t.Run("every worker held by a hung coderd: a healthy control plane waits at most the Coder request timeout", func(t *testing.T) {
		// One more hung control plane than workers: each worker is in a
		// hung call and one hung control plane waits in the queue.
		addHung(workers-1, workers+1)
		inFlight(workers)
		start := time.Now()
		createAdoptingControlPlane(t, s, s.ns, "good-2", s.coder.URL.String(), s.coder.SessionToken)
		// A worker frees when its hung call times out; the slack covers
		// the queued hung control plane taking the first one and the
		// access setup on a loaded machine.
		waitOperatorAccess(t, s, s.ns, "good-2", s.coder.URL.String(), held+20*time.Second)
		t.Logf("healthy control plane ready after %s next to %d hung ones (%d workers, Coder request timeout %s)",
			time.Since(start).Round(time.Millisecond), workers+1, workers, held)
	})
}

// hungServer accepts connections and never answers.
type hungServer struct {
	l                      net.Listener
	accepted, closedByPeer atomic.Int64
	mu                     sync.Mutex
	conns                  []net.Conn
}

// startHungServer listens on loopback until the test ends.
func startHungServer(t *testing.T) *hungServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hungServer{l: l}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, conn)
			h.mu.Unlock()
			h.accepted.Add(1)
			go func() {
				// Read the request and anything after it, answer nothing;
				// the read ends when the client gives up.
				_, _ = io.Copy(io.Discard, conn)
				h.closedByPeer.Add(1)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	return h
}

// open is the number of connections the clients hold open now.
func (h *hungServer) open() int { return int(h.accepted.Load() - h.closedByPeer.Load()) }

// closed is the number of connections the clients closed.
func (h *hungServer) closed() int { return int(h.closedByPeer.Load()) }

func conditionSummary(conds []metav1.Condition) string {
	var parts []string
	for _, c := range conds {
		parts = append(parts, c.Type+"="+string(c.Status)+" ("+c.Reason+": "+c.Message+")")
	}
	if len(parts) == 0 {
		return "no conditions"
	}
	return strings.Join(parts, "; ")
}
