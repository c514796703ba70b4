// Package metricstest reads coder-k8s metrics back from controller-runtime's
// registry, for tests: what a scrape of /metrics would show.
package metricstest

import (
	"bytes"
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/kubernetes"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Value returns the value of the series of metric name whose labels
// include labels: a counter's or gauge's value, a histogram's count. It
// is 0 when no such series exists; several matching series are added up.
func Value(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, m := range Series(t, name, labels) {
		sum += value(m)
	}
	return sum
}

// value is a counter's or gauge's value, a histogram's count.
func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
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

// APIServerValue scrapes /metrics of the Kubernetes API server that kube
// (an admin client) talks to and returns, as Value does, the sum of the
// series of metric name whose labels include labels.
func APIServerValue(t testing.TB, kube kubernetes.Interface, name string, labels map[string]string) float64 {
	t.Helper()
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("scrape kube-apiserver's /metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("parse kube-apiserver's /metrics: %v", err)
	}
	var sum float64
	for _, m := range families[name].GetMetric() {
		if Matches(m, labels) {
			sum += value(m)
		}
	}
	return sum
}
