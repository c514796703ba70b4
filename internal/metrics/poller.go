package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PollerState is what a poller reports when Prometheus scrapes.
type PollerState struct {
	// Watchers is the number of open watches; the poller polls only
	// while there is at least one.
	Watchers int
	// Backends are the control planes whose objects the cache holds or
	// the poller lists.
	Backends []PollerBackend
}

// PollerBackend is one control plane in a poller's cache.
type PollerBackend struct {
	ControlPlane string
	// Objects is the number of objects cached.
	Objects int
	// Lag is how long ago the cached state was last known complete; it is
	// reported only when Polled.
	Lag time.Duration
	// Backoff is how long the poller still waits before listing this
	// control plane again after failures (0 when it does not).
	Backoff time.Duration
	// Polled is true while the poller lists this control plane (someone
	// watches).
	Polled bool
}

// RegisterPoller makes the scrape ask state for the poller of kind, until
// the returned function is called. Several pollers of one kind (tests,
// or two servers in one process) are added up; lags take the maximum.
func RegisterPoller(kind string, state func() PollerState) (unregister func()) {
	return pollers.add(kind, state)
}

// pollers computes the poller gauges at scrape time, so that lag keeps
// growing while a poller is stuck and control planes that went away
// leave no stale series.
var pollers = &pollerCollector{sources: map[int]pollerSource{}}

type pollerSource struct {
	kind  string
	state func() PollerState
}

type pollerCollector struct {
	mu      sync.Mutex
	next    int
	sources map[int]pollerSource
}

var (
	pollerLagDesc = prometheus.NewDesc(prefix+"poller_lag_seconds",
		"Seconds since the aggregated API's cached objects of a control plane were last known complete (its last successful list), counted from when watching started at most; reported only while someone watches, since the poller is idle otherwise. Alert on it: watch events are at least this late.",
		[]string{"control_plane", "kind"}, nil)
	pollerObjectsDesc = prometheus.NewDesc(prefix+"poller_objects",
		"Objects the aggregated API's watch cache holds, by control plane and kind.",
		[]string{"control_plane", "kind"}, nil)
	pollerBackoffDesc = prometheus.NewDesc(prefix+"poller_backoff_seconds",
		"Seconds the aggregated API's poller still waits before listing a control plane again after failed lists (at least the Retry-After coderd sent with a 429 or 503); 0 when it is not backing off.",
		[]string{"control_plane", "kind"}, nil)
	pollerWatchersDesc = prometheus.NewDesc(prefix+"poller_watchers",
		"Open watches served by the aggregated API's watch cache, by kind.",
		[]string{"kind"}, nil)
)

func (c *pollerCollector) add(kind string, state func() PollerState) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.next
	c.next++
	c.sources[id] = pollerSource{kind: kind, state: state}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.sources, id)
	}
}

func (c *pollerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pollerLagDesc
	ch <- pollerObjectsDesc
	ch <- pollerWatchersDesc
	ch <- pollerBackoffDesc
}

func (c *pollerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]pollerSource, 0, len(c.sources))
	for _, s := range c.sources {
		sources = append(sources, s)
	}
	c.mu.Unlock()

	type key struct{ kind, controlPlane string }
	watchers := map[string]int{}
	objects := map[key]int{}
	lag := map[key]time.Duration{}
	backoff := map[key]time.Duration{}
	for _, s := range sources {
		st := s.state()
		watchers[s.kind] += st.Watchers
		for _, b := range st.Backends {
			k := key{s.kind, b.ControlPlane}
			objects[k] += b.Objects
			backoff[k] = max(backoff[k], b.Backoff)
			if b.Polled {
				lag[k] = max(lag[k], b.Lag)
			}
		}
	}
	for kind, n := range watchers {
		ch <- prometheus.MustNewConstMetric(pollerWatchersDesc, prometheus.GaugeValue, float64(n), kind)
	}
	for k, n := range objects {
		ch <- prometheus.MustNewConstMetric(pollerObjectsDesc, prometheus.GaugeValue, float64(n), k.controlPlane, k.kind)
	}
	for k, d := range backoff {
		ch <- prometheus.MustNewConstMetric(pollerBackoffDesc, prometheus.GaugeValue, d.Seconds(), k.controlPlane, k.kind)
	}
	for k, d := range lag {
		ch <- prometheus.MustNewConstMetric(pollerLagDesc, prometheus.GaugeValue, d.Seconds(), k.controlPlane, k.kind)
	}
}
