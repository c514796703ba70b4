package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/config"
)

// TestClusterControllers: aggregatedAPI.clusterControllers reaches the
// binary's config as it is written, including an empty list (which must
// not fall back to the binary's defaults), and the config key itself is
// the chart's.
func TestClusterControllers(t *testing.T) {
	for _, tc := range []struct {
		name string
		list any // nil: the chart's default
		want []string
	}{
		{"default", nil, config.DefaultClusterControllers()},
		{"others", []any{"system:serviceaccount:kube-system:generic-garbage-collector", "my-gc"},
			[]string{"system:serviceaccount:kube-system:generic-garbage-collector", "my-gc"}},
		{"none", []any{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			if tc.list != nil {
				vals["aggregatedAPI"] = map[string]any{"clusterControllers": tc.list}
			}
			cfg := loadConfig(t, configFile(t, mustRender(t, renderOptions{}, vals)))
			if got := cfg.AggregatedAPIServer.Identity.ClusterControllers; !slices.Equal(got, tc.want) {
				t.Errorf("config clusterControllers = %q, want %q", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"the config key is the chart's", map[string]any{"config": map[string]any{"aggregatedAPIServer": map[string]any{
			"identity": map[string]any{"clusterControllers": []any{"x"}}}}}, "identity"},
		{"anonymous", map[string]any{"aggregatedAPI": map[string]any{"clusterControllers": []any{"system:anonymous"}}}, "clusterControllers"},
		{"padded", map[string]any{"aggregatedAPI": map[string]any{"clusterControllers": []any{" my-gc"}}}, "clusterControllers"},
		{"twice", map[string]any{"aggregatedAPI": map[string]any{"clusterControllers": []any{"my-gc", "my-gc"}}}, "clusterControllers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, renderOptions{}, tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want the schema to refuse it naming %q", err, tc.want)
			}
		})
	}
}
