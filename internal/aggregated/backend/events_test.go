package backend

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/metrics/metricstest"
)

// TestProblemsBecomeEvents: when coderd rejects a control plane's operator
// token or does not answer, the aggregated API's requests fail; a Warning
// event on the CoderControlPlane says why (once per interval, however
// many requests fail), and the requests are counted under the control
// plane's label.
func TestProblemsBecomeEvents(t *testing.T) {
	c := kubeClient(t)
	ctx := t.Context()
	ns := namespace(t, "problems")
	createControlPlane(t, c, ns, controlPlane{name: "rejected", token: "not-a-coder-token"})
	// coderd moved to where nothing listens (its token was issued there).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadURL := "http://" + ln.Addr().String()
	ln.Close()
	down := createControlPlane(t, c, ns, controlPlane{name: "down", issuedFor: deadURL})
	down.Status.URL = deadURL
	if err := c.Status().Update(ctx, down); err != nil {
		t.Fatal(err)
	}

	p := startProvider(t, ns)
	var bs []Backend
	eventually(t, "both control planes served, down at its new URL", func() (bool, string) {
		bs, err = p.Backends(ctx, ns)
		if err != nil {
			return false, err.Error()
		}
		return len(bs) == 2 && bs[0].URL.String() == deadURL, fmt.Sprintf("%v", keys(bs))
	})
	downB, rejected := bs[0], bs[1]

	// Several failing requests each.
	for range 3 {
		if _, err := rejected.Client.User(ctx, codersdk.Me); err == nil {
			t.Fatal("coderd accepted a made-up token")
		}
		if _, err := downB.Client.BuildInfo(ctx); err == nil {
			t.Fatal("a closed port answered")
		}
	}

	events := func(object, reason string) []eventsv1.Event {
		list, err := kube.Clientset.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []eventsv1.Event
		for _, e := range list.Items {
			if e.Regarding.Kind == "CoderControlPlane" && e.Regarding.Name == object && e.Reason == reason {
				out = append(out, e)
			}
		}
		return out
	}
	for _, tc := range []struct{ object, reason, says string }{
		{"rejected", ReasonOperatorTokenRejected, "rejected the operator token (401 on GET /api/v2/users/me)"},
		{"down", ReasonCoderdUnreachable, "could not reach coderd at " + deadURL},
	} {
		eventually(t, tc.reason+" event on "+tc.object, func() (bool, string) {
			got := events(tc.object, tc.reason)
			if len(got) == 0 {
				return false, "none yet"
			}
			e := got[0]
			if e.Type != "Warning" || !strings.Contains(e.Note, tc.says) {
				return false, fmt.Sprintf("%s %q", e.Type, e.Note)
			}
			return true, ""
		})
	}
	// Give a second event time to arrive, were there one.
	time.Sleep(2 * time.Second)
	for _, object := range []string{"rejected", "down"} {
		for _, reason := range []string{ReasonOperatorTokenRejected, ReasonCoderdUnreachable} {
			// A repeated event would be a second Event or a series.
			got := events(object, reason)
			if len(got) > 1 || len(got) == 1 && got[0].Series != nil {
				t.Errorf("%s: %s recorded more than once after 3 failed requests: %+v", object, reason, got)
			}
		}
	}

	for _, tc := range []struct{ cp, op, code string }{
		{ns + "/rejected", "GET /api/v2/users/me", "4xx"},
		{ns + "/down", "GET /api/v2/buildinfo", "error"},
	} {
		labels := map[string]string{"control_plane": tc.cp, "operation": tc.op, "component": "aggregated", "code": tc.code}
		if got := metricstest.Value(t, "coder_k8s_coder_api_requests_total", labels); got != 3 {
			t.Errorf("requests %v: %v, want 3", labels, got)
		}
	}
}

// One event per control plane and reason per interval, however many
// requests fail; other control planes and reasons are not held back.
func TestProblemEventsAreRateLimited(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	r := newProblemReporter(nil, nil)
	r.now = func() time.Time { return now }
	a := problemKey{controlPlane: types.NamespacedName{Namespace: "ns", Name: "a"}, reason: ReasonCoderdUnreachable}
	b := problemKey{controlPlane: types.NamespacedName{Namespace: "ns", Name: "b"}, reason: ReasonCoderdUnreachable}
	a401 := problemKey{controlPlane: a.controlPlane, reason: ReasonOperatorTokenRejected}
	steps := []struct {
		after time.Duration
		key   problemKey
		want  bool
	}{
		{0, a, true},
		{time.Second, a, false},
		{0, b, true},
		{0, a401, true},
		{problemEventInterval - 2*time.Second, a, false},
		{2 * time.Second, a, true},
		{time.Second, a, false},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		if got := r.allow(s.key); got != s.want {
			t.Errorf("step %d (%s %s): allow = %v, want %v", i, s.key.controlPlane, s.key.reason, got, s.want)
		}
	}
}

// A rejected token asks the controller for an access check at once, but
// a burst of rejected requests asks only once per recheckInterval; other
// failures never ask.
func TestRejectedTokenAsksForRecheck(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var asked []types.NamespacedName
	r := newProblemReporter(nil, func(k types.NamespacedName) { asked = append(asked, k) })
	r.now = func() time.Time { return now }
	ccp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}
	observe := r.observer(ccp, "http://coderd.example")
	if observe == nil {
		t.Fatal("no observer although a recheck function is set")
	}
	key := types.NamespacedName{Namespace: "ns", Name: "a"}

	observe("GET /api/v2/workspaces", http.StatusServiceUnavailable, nil)
	observe("GET /api/v2/workspaces", 0, errors.New("connection refused"))
	if len(asked) != 0 {
		t.Fatalf("recheck asked for a 503 or a transport error: %v", asked)
	}
	for range 5 {
		observe("GET /api/v2/workspaces", http.StatusUnauthorized, nil)
	}
	if len(asked) != 1 || asked[0] != key {
		t.Fatalf("after five 401s: rechecks %v, want one for %s", asked, key)
	}
	now = now.Add(recheckInterval - time.Second)
	observe("GET /api/v2/workspaces", http.StatusUnauthorized, nil)
	if len(asked) != 1 {
		t.Fatalf("recheck asked again within %s: %v", recheckInterval, asked)
	}
	now = now.Add(time.Second)
	observe("GET /api/v2/workspaces", http.StatusUnauthorized, nil)
	if len(asked) != 2 {
		t.Fatalf("no recheck after %s: %v", recheckInterval, asked)
	}
}
