package operatoraccess_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"k8s.io/client-go/tools/events"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
)

// A rotated operator token is revoked only after the revocation delay,
// whichever operator process makes the pass that is due: the pending
// revocation is recorded in the token Secret, not in memory. Disabling
// access revokes a replaced token still in its grace period too.
func TestReplacedTokenRevocation(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	f := newFixture(t, k)
	ctx := context.Background()
	works := func(t *testing.T, what string, c *codersdk.Client) {
		t.Helper()
		if _, err := c.User(ctx, codersdk.Me); err != nil {
			t.Fatalf("%s: coderd refuses it: %v", what, err)
		}
	}
	revoked := func(t *testing.T, what string, c *codersdk.Client) {
		t.Helper()
		if _, err := c.User(ctx, codersdk.Me); !coderapi.IsUnauthorized(err) {
			t.Errorf("%s: coderd still takes it (%v), want 401", what, err)
		}
	}

	t.Run("a pass before the delay keeps the replaced token; the first pass after it revokes it", func(t *testing.T) {
		ccp := f.ownerTokenAccess(t, "timing", coder, 24*time.Hour)
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		old := f.expireSoon(t, ccp, coder.URL, r)
		rotated, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, rotated, err)
		works(t, "the new token", f.tokenClient(t, ccp, coder.URL, rotated))

		// A pass in between (another change of the control plane) answers
		// from the last check, revokes nothing and comes back when the
		// revocation is due, not at the next access check.
		between, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, between, err)
		works(t, "the replaced token during its grace period", old)
		if between.RequeueAfter <= 0 || between.RequeueAfter > testRevokeDelay+time.Second {
			t.Errorf("a pass during the grace period requeues after %s, want at most %s (rounded up to the second)", between.RequeueAfter, testRevokeDelay)
		}
		f.revokedAfterDelay(t, ccp, coder.URL.String(), rotated, old)
		works(t, "the new token after the revocation", f.tokenClient(t, ccp, coder.URL, rotated))
	})

	t.Run("a restarted operator revokes the token its predecessor replaced", func(t *testing.T) {
		ccp := f.ownerTokenAccess(t, "restart", coder, 24*time.Hour)
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		old := f.expireSoon(t, ccp, coder.URL, r)
		rotated, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, rotated, err)
		works(t, "the replaced token right after the rotation", old)

		// The process that rotated is gone; a new leader knows nothing
		// but what the Secret says.
		rec := events.NewFakeRecorder(10)
		next := &operatoraccess.Manager{Client: f.c, Recorder: rec, Timeout: 5 * time.Second, RevokeReplacedAfter: testRevokeDelay}
		early, err := next.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, early, err)
		works(t, "the replaced token before the delay, after a restart", old)
		time.Sleep(early.RequeueAfter)
		late, err := next.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, late, err)
		revoked(t, "the replaced token after the delay, revoked by the new leader", old)
		works(t, "the current token", f.tokenClient(t, ccp, coder.URL, late))
		if got := <-rec.Events; !strings.Contains(got, "OperatorTokenRevoked") {
			t.Errorf("event = %q, want OperatorTokenRevoked", got)
		}
	})

	t.Run("disabling access revokes a replaced token still in its grace period", func(t *testing.T) {
		ccp := f.ownerTokenAccess(t, "disable", coder, 24*time.Hour)
		r, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, r, err)
		old := f.expireSoon(t, ccp, coder.URL, r)
		rotated, err := f.m.Reconcile(ctx, ccp, coder.URL.String())
		mustReady(t, rotated, err)
		current := f.tokenClient(t, ccp, coder.URL, rotated)
		works(t, "the replaced token right after the rotation", old)

		ccp.Spec.OperatorAccess.Disabled = true
		if _, err := f.m.Reconcile(ctx, ccp, coder.URL.String()); err != nil {
			t.Fatal(err)
		}
		revoked(t, "the replaced token once access is disabled", old)
		revoked(t, "the current token once access is disabled", current)
	})
}
