package e2e

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// A user adopts an existing coderd with a CoderControlPlane; the running
// operator sets up its own user and token and reports it in status.
func TestAdoptExistingCoderd(t *testing.T) {
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
// the full Coder request timeout; other control planes must not wait for it.
func TestHungCoderdDoesNotBlockOthers(t *testing.T) {
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})

	s := newStack(t, withoutAPIService())
	// Several hung control planes first, so they occupy reconcile workers.
	for i := range 3 {
		createAdoptingControlPlane(t, s, s.ns, "hung-"+strconv.Itoa(i), "http://"+hung.Addr().String(), s.coder.SessionToken)
	}
	start := time.Now()
	createAdoptingControlPlane(t, s, s.ns, "good", s.coder.URL.String(), s.coder.SessionToken)
	// Well inside the 30s Coder request timeout the hung ones are held for.
	waitOperatorAccess(t, s, s.ns, "good", s.coder.URL.String(), 20*time.Second)
	t.Logf("healthy control plane ready after %s next to 3 hung ones", time.Since(start).Round(time.Millisecond))
}

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
