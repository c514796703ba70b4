package metrics_test

import (
	"testing"
	"time"

	"github.com/coder/coder-k8s/internal/metrics"
	"github.com/coder/coder-k8s/internal/metrics/metricstest"
)

// Two pollers of one kind (two servers in one process) add up: one series
// per control plane, the larger lag, no duplicate series that would make
// the scrape fail.
func TestPollersOfOneKindAddUp(t *testing.T) {
	const kind = "TestKind"
	one := metrics.RegisterPoller(kind, func() metrics.PollerState {
		return metrics.PollerState{Watchers: 1, Backends: []metrics.PollerBackend{
			{ControlPlane: "ns/a", Objects: 2, Lag: 3 * time.Second, Polled: true},
			{ControlPlane: "ns/b", Objects: 1, Lag: time.Hour}, // not polled: no lag
		}}
	})
	two := metrics.RegisterPoller(kind, func() metrics.PollerState {
		return metrics.PollerState{Watchers: 2, Backends: []metrics.PollerBackend{
			{ControlPlane: "ns/a", Objects: 5, Lag: 7 * time.Second, Polled: true},
		}}
	})
	defer one()
	labels := func(cp string) map[string]string { return map[string]string{"kind": kind, "control_plane": cp} }
	for _, tc := range []struct {
		name string
		cp   string
		want float64
	}{
		{"coder_k8s_poller_objects", "ns/a", 7},
		{"coder_k8s_poller_objects", "ns/b", 1},
		{"coder_k8s_poller_lag_seconds", "ns/a", 7},
	} {
		if s := metricstest.Series(t, tc.name, labels(tc.cp)); len(s) != 1 || s[0].GetGauge().GetValue() != tc.want {
			t.Errorf("%s{control_plane=%q}: %v, want one series of %v", tc.name, tc.cp, s, tc.want)
		}
	}
	if s := metricstest.Series(t, "coder_k8s_poller_lag_seconds", labels("ns/b")); len(s) != 0 {
		t.Errorf("lag of a control plane nobody polls: %v", s)
	}
	if got := metricstest.Value(t, "coder_k8s_poller_watchers", map[string]string{"kind": kind}); got != 3 {
		t.Errorf("watchers %v, want 3", got)
	}
	two()
	if got := metricstest.Value(t, "coder_k8s_poller_objects", labels("ns/a")); got != 2 {
		t.Errorf("objects after one poller left: %v, want 2", got)
	}
}
