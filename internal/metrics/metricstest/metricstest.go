// Package metricstest reads coder-k8s metrics back from controller-runtime's
// registry, for tests: what a scrape of /metrics would show.
package metricstest

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Value returns the value of the series of metric name whose labels
// include labels: a counter's or gauge's value, a histogram's count. It
// is 0 when no such series exists; several matching series are added up.
func Value(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, m := range Series(t, name, labels) {
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// Series returns the series of metric name whose labels include labels.
func Series(t testing.TB, name string, labels map[string]string) []*dto.Metric {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if Matches(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out
}

// Matches reports whether m has every label of labels.
func Matches(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Label returns the value of label name of m ("" when absent).
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
