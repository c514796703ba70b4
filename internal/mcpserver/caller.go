package mcpserver

import (
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// callerClients builds Kubernetes clients that act as an MCP caller: the
// operator's connection settings (host, CA, QPS, timeouts) with none of its
// credentials, and the caller's bearer token. kube-apiserver then applies
// the caller's RBAC and admission and audits the caller, as for kubectl.
type callerClients struct {
	// config has no credentials of its own.
	config *rest.Config
	// transport is shared by every caller, so connections to
	// kube-apiserver are reused; each caller's token is added per request.
	transport http.RoundTripper
	timeout   time.Duration
	scheme    *runtime.Scheme
	// mapper is shared too: discovery is the same for everyone, and
	// per-caller discovery would cost requests on every new token.
	mapper meta.RESTMapper
}

func newCallerClients(operator *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper) (*callerClients, error) {
	// Only known-safe fields are copied: no client certificate, bearer
	// token (or file), basic auth, exec or auth provider, impersonation
	// or custom transport.
	cfg := rest.AnonymousClientConfig(operator)
	// The tools read lists of hundreds of KiB from kube-apiserver in the
	// same cluster, where gzip costs more CPU than it saves.
	cfg.DisableCompression = true
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("mcp: HTTP client for callers: %w", err)
	}
	return &callerClients{config: cfg, transport: hc.Transport, timeout: hc.Timeout, scheme: scheme, mapper: mapper}, nil
}

// forToken returns clients that send token with every request.
func (f *callerClients) forToken(token string) (Kube, error) {
	hc := &http.Client{Transport: transport.NewBearerAuthRoundTripper(token, f.transport), Timeout: f.timeout}
	cl, err := client.New(f.config, client.Options{HTTPClient: hc, Scheme: f.scheme, Mapper: f.mapper})
	if err != nil {
		return Kube{}, fmt.Errorf("kubernetes client for the caller: %w", err)
	}
	cs, err := kubernetes.NewForConfigAndClient(f.config, hc)
	if err != nil {
		return Kube{}, fmt.Errorf("kubernetes clientset for the caller: %w", err)
	}
	// Nothing cached: a cache's reads would bypass the caller's RBAC.
	return Kube{Cached: cl, Direct: cl, Clientset: cs}, nil
}
