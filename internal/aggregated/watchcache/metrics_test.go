package watchcache

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/coder/coder-k8s/internal/metrics/metricstest"
)

// TestPollerMetrics checks the poller gauges and counters /metrics shows:
// objects per control plane, lag growing for a control plane whose lists
// fail (and only while someone watches), refresh errors, watchers, and
// nothing once the poller stops.
func TestPollerMetrics(t *testing.T) {
	const kind = "PartialObjectMetadata" // the type newObject returns
	good := newFakeSource("metrics-a/cp", obj("metrics-a", "x", nil), obj("metrics-a", "y", nil))
	bad := newFakeSource("metrics-b/cp", obj("metrics-b", "z", nil))
	static := newFakeSource("metrics-c/", obj("metrics-c", "s", nil))
	c, fc, _ := newPolledCache(t, good, bad, static)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })

	labels := func(cp string) map[string]string { return map[string]string{"control_plane": cp, "kind": kind} }
	gauge := func(name, cp string) (float64, bool) {
		s := metricstest.Series(t, name, labels(cp))
		if len(s) != 1 {
			return 0, false
		}
		return s[0].GetGauge().GetValue(), true
	}
	waitGauge := func(name, cp string, want float64) {
		t.Helper()
		waitFor(t, name+" of "+cp, func() bool {
			v, ok := gauge(name, cp)
			return ok && v == want
		})
	}

	time.Sleep(20 * time.Millisecond)
	if _, ok := gauge("coder_k8s_poller_lag_seconds", "metrics-a/cp"); ok {
		t.Error("lag reported before anyone watched")
	}

	w := startWatch(t, c, WatchOptions{ResourceVersion: c.ResourceVersion()})
	nextEvents(t, w, 4)
	waitGauge("coder_k8s_poller_objects", "metrics-a/cp", 2)
	waitGauge("coder_k8s_poller_objects", "metrics-b/cp", 1)
	// The backend without a control plane (the static backend).
	waitGauge("coder_k8s_poller_objects", "static", 1)
	waitGauge("coder_k8s_poller_lag_seconds", "metrics-a/cp", 0)
	if n := metricstest.Value(t, "coder_k8s_poller_watchers", map[string]string{"kind": kind}); n != 1 {
		t.Errorf("watchers = %v, want 1", n)
	}

	errorsBefore := metricstest.Value(t, "coder_k8s_poller_refresh_errors_total", labels("metrics-b/cp"))
	bad.fail(errors.New("coderd unavailable"))
	for i := 1; i <= 2; i++ {
		waitFor(t, "poll timer", fc.HasWaiters)
		fc.Step(interval)
		want := float64(i) * interval.Seconds()
		waitGauge("coder_k8s_poller_lag_seconds", "metrics-b/cp", want)
		waitGauge("coder_k8s_poller_lag_seconds", "metrics-a/cp", 0)
		waitFor(t, "refresh errors", func() bool {
			return metricstest.Value(t, "coder_k8s_poller_refresh_errors_total", labels("metrics-b/cp")) == errorsBefore+float64(i)
		})
	}
	// The failing control plane keeps its objects.
	waitGauge("coder_k8s_poller_objects", "metrics-b/cp", 1)

	// Nobody watches: the poller idles and reports no lag.
	w.Stop()
	waitFor(t, "poll timer", fc.HasWaiters)
	fc.Step(interval)
	waitFor(t, "lag gone while idle", func() bool {
		_, ok := gauge("coder_k8s_poller_lag_seconds", "metrics-b/cp")
		return !ok
	})

	cancel()
	<-done
	if s := metricstest.Series(t, "coder_k8s_poller_objects", labels("metrics-a/cp")); len(s) != 0 {
		t.Errorf("objects still reported after the poller stopped: %v", s)
	}
}
