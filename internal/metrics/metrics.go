// Package metrics defines every Prometheus metric coder-k8s exports
// beyond controller-runtime's own, in controller-runtime's registry, so
// that /metrics serves them in every mode. docs/metrics.md describes them.
//
// Label values come from small fixed sets (operations are normalized
// routes, outcomes and codes are constants) or from the control planes
// the operator serves, so the number of series stays bounded.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Components that call coderd: the component label.
const (
	ComponentController = "controller"
	ComponentAggregated = "aggregated"
	ComponentMCP        = "mcp"
)

// StaticControlPlane is the control_plane label of the static backend
// (aggregatedAPIServer.coder.staticBackend), which has no
// CoderControlPlane.
const StaticControlPlane = "static"

// ControlPlane is the control_plane label of a CoderControlPlane.
func ControlPlane(namespace, name string) string { return namespace + "/" + name }

// Codes of coderd requests that got no HTTP answer.
const (
	// CodeError: no answer (connection refused, DNS, TLS, timeout).
	CodeError = "error"
	// CodeCanceled: the caller gave up first (a client hung up).
	CodeCanceled = "canceled"
)

// Outcomes of template build waits.
const (
	BuildSucceeded = "succeeded"
	BuildFailed    = "failed"
	BuildCanceled  = "canceled"
	BuildTimeout   = "timeout"
	// BuildError: coderd answered the wait's polls with an error that is
	// not worth retrying (401, 404, ...).
	BuildError = "error"
)

// Outcomes of MCP tool calls.
const (
	ToolOK      = "ok"
	ToolError   = "error"
	ToolDenied  = "denied"
	ToolInvalid = "invalid"
)

const prefix = "coder_k8s_"

var (
	coderRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "coder_api_requests_total",
		Help: "Requests coder-k8s made to coderd, by operation (method and normalized route), control plane, component and code (HTTP status class, \"error\" when coderd gave no answer, \"canceled\" when the caller gave up first).",
	}, []string{"operation", "control_plane", "component", "code"})

	coderRequestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "coder_api_request_duration_seconds",
		Help:    "Time from sending a request to coderd until its response headers arrived (or it failed), by operation, control plane and component.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"operation", "control_plane", "component"})

	pollerRefreshErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "poller_refresh_errors_total",
		Help: "Failed lists of a control plane's objects by the aggregated API's poller (its cached state was kept), by control plane and kind.",
	}, []string{"control_plane", "kind"})

	pollerBackoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "poller_backoffs_total",
		Help: "Times the aggregated API's poller delayed a control plane's next list after a failure, by control plane, kind and reason (retry_after: coderd sent Retry-After with a 429 or 503; error: repeated failures).",
	}, []string{"control_plane", "kind", "reason"})

	buildWaitDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "template_build_wait_duration_seconds",
		Help:    "Time the aggregated API waited for a template version's build in coderd, by outcome (succeeded, failed, canceled, timeout, error).",
		Buckets: []float64{1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
	}, []string{"outcome"})

	toolCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "mcp_tool_calls_total",
		Help: "MCP tool calls, by tool and outcome (ok, error, denied by the caller's RBAC, invalid arguments or tool name).",
	}, []string{"tool", "outcome"})

	toolCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    prefix + "mcp_tool_call_duration_seconds",
		Help:    "Time to answer an MCP tool call, by tool.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"tool"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(coderRequests, coderRequestDuration, pollerRefreshErrors,
		pollerBackoffs, buildWaitDuration, toolCalls, toolCallDuration, pollers)
}

// ObserveCoderRequest records one request to coderd.
func ObserveCoderRequest(operation, controlPlane, component, code string, d time.Duration) {
	coderRequests.WithLabelValues(operation, controlPlane, component, code).Inc()
	coderRequestDuration.WithLabelValues(operation, controlPlane, component).Observe(d.Seconds())
}

// PollerRefreshFailed records a failed list of one control plane's
// objects of kind by the poller.
func PollerRefreshFailed(controlPlane, kind string) {
	pollerRefreshErrors.WithLabelValues(controlPlane, kind).Inc()
}

// PollerBackedOff records that the poller delays its next list of one
// control plane's objects of kind; reason is "retry_after" or "error".
func PollerBackedOff(controlPlane, kind, reason string) {
	pollerBackoffs.WithLabelValues(controlPlane, kind, reason).Inc()
}

// ObserveBuildWait records a finished template build wait.
func ObserveBuildWait(outcome string, d time.Duration) {
	buildWaitDuration.WithLabelValues(outcome).Observe(d.Seconds())
}

// ObserveToolCall records one MCP tool call.
func ObserveToolCall(tool, outcome string, d time.Duration) {
	toolCalls.WithLabelValues(tool, outcome).Inc()
	toolCallDuration.WithLabelValues(tool).Observe(d.Seconds())
}
