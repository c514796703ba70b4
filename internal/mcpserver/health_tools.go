package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/metrics"
)

// Health checks are quick: a coderd that does not answer within
// coderdProbeTimeout counts as unreachable.
const (
	coderdProbeTimeout = 5 * time.Second
	kubeProbeTimeout   = 5 * time.Second
	// coderdProbeParallelism bounds concurrent coderd probes of one call.
	coderdProbeParallelism = 8
)

// HealthInput selects the control planes to check.
type HealthInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"only control planes in this Kubernetes namespace; empty means every namespace"`
	Limit     int    `json:"limit,omitempty" jsonschema:"control planes to check (default 20, at most 100)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, to check the next control planes"`
}

// KubernetesHealth is whether kube-apiserver answers.
type KubernetesHealth struct {
	Reachable bool   `json:"reachable"`
	Version   string `json:"version,omitempty" jsonschema:"kube-apiserver's version"`
	Error     string `json:"error,omitempty"`
	LatencyMs int64  `json:"latencyMs"`
}

// ControlPlaneHealth is whether one control plane's coderd answers.
type ControlPlaneHealth struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase,omitempty"`
	URL       string `json:"url,omitempty" jsonschema:"status.url, where the operator reaches coderd"`
	Reachable bool   `json:"reachable" jsonschema:"coderd answered GET /api/v2/buildinfo"`
	Version   string `json:"version,omitempty" jsonschema:"the Coder version coderd reports"`
	Error     string `json:"error,omitempty" jsonschema:"why coderd did not answer"`
	LatencyMs int64  `json:"latencyMs,omitempty"`
}

// HealthReport is the health of Kubernetes and of a page of control planes.
type HealthReport struct {
	Healthy       bool                 `json:"healthy" jsonschema:"Kubernetes and every control plane checked answered"`
	Kubernetes    KubernetesHealth     `json:"kubernetes"`
	ControlPlanes []ControlPlaneHealth `json:"controlPlanes"`
	Message       string               `json:"message,omitempty"`
	Continue      string               `json:"continue,omitempty" jsonschema:"pass to the next call to check more control planes; empty at the end"`
}

func (s *Server) healthTools() []tool {
	return []tool{
		define(s, "health", toolMeta{
			Title: "Check Kubernetes and coderd health",
			Description: "Checks that Kubernetes (kube-apiserver) answers and, for each CoderControlPlane (optionally of one namespace, a page at a time), that its coderd answers GET /api/v2/buildinfo at its status URL within " +
				coderdProbeTimeout.String() + ", with the versions. Run it first when tools fail with unavailable or timeout errors; for a control plane that does not answer, use get_control_plane and list_control_plane_pods.",
			ReadOnly: true, Idempotent: true, OpenWorld: true,
		}, health),
	}
}

func health(ctx context.Context, c *call, in HealthInput) (HealthReport, error) {
	out := HealthReport{Kubernetes: c.kubernetesHealth(ctx), ControlPlanes: []ControlPlaneHealth{}}
	var list coderv1alpha1.CoderControlPlaneList
	if err := c.kube.Cached.List(ctx, &list, client.InNamespace(in.Namespace)); err != nil {
		if out.Kubernetes.Reachable || apierrors.IsForbidden(err) {
			return HealthReport{}, fmt.Errorf("list codercontrolplanes: %w", err)
		}
		// Kubernetes is down: report what is known.
		out.Message = "control planes not checked: they could not be listed while Kubernetes is unreachable (" + err.Error() + ")"
		return out, nil
	}
	if err := sortListed(ctx, c, in.Namespace, list.Items, func(ns string) error {
		return fmt.Errorf("namespace %q does not exist; call health without a namespace to check every control plane", ns)
	}); err != nil {
		return HealthReport{}, err
	}
	items, next, err := page(list.Items, in.Limit, in.Continue)
	if err != nil {
		return HealthReport{}, err
	}
	out.Continue = next

	out.ControlPlanes = make([]ControlPlaneHealth, len(items))
	sem := make(chan struct{}, coderdProbeParallelism)
	var wg sync.WaitGroup
	for i := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out.ControlPlanes[i] = probeCoderd(ctx, &items[i])
		}()
	}
	wg.Wait()

	out.Healthy = out.Kubernetes.Reachable
	for _, cp := range out.ControlPlanes {
		out.Healthy = out.Healthy && cp.Reachable
	}
	if len(items) == 0 && in.Continue == "" {
		out.Message = "no CoderControlPlane objects to check"
		if in.Namespace != "" {
			out.Message += " in namespace " + in.Namespace
		}
	}
	return out, nil
}

// kubernetesHealth asks kube-apiserver for its version, which every
// authenticated client may read.
func (c *call) kubernetesHealth(ctx context.Context) KubernetesHealth {
	if c.kube.Clientset == nil {
		return KubernetesHealth{Error: "no Kubernetes client configured"}
	}
	ctx, cancel := context.WithTimeout(ctx, kubeProbeTimeout)
	defer cancel()
	start := time.Now()
	var (
		info *version.Info
		err  error
	)
	if rc := c.kube.Clientset.Discovery().RESTClient(); rc != nil {
		var raw []byte
		if raw, err = rc.Get().AbsPath("/version").Do(ctx).Raw(); err == nil {
			info = &version.Info{}
			if err = json.Unmarshal(raw, info); err != nil {
				err = fmt.Errorf("decode /version: %w", err)
			}
		}
	} else {
		info, err = c.kube.Clientset.Discovery().ServerVersion()
	}
	h := KubernetesHealth{LatencyMs: time.Since(start).Milliseconds()}
	if err != nil {
		h.Error = "GET /version: " + err.Error()
		return h
	}
	h.Reachable, h.Version = true, info.GitVersion
	return h
}

// probeCoderd asks cp's coderd for its build info. It sends no token,
// neither the caller's nor coder-k8s's: buildinfo is public and reads no
// user data.
func probeCoderd(ctx context.Context, cp *coderv1alpha1.CoderControlPlane) ControlPlaneHealth {
	h := ControlPlaneHealth{Namespace: cp.Namespace, Name: cp.Name, Phase: string(cp.Status.Phase), URL: redactURL(cp.Status.URL)}
	if cp.Status.URL == "" {
		h.Error = "no status.url yet: the operator has not reconciled this control plane (get_control_plane shows its conditions)"
		return h
	}
	u, err := url.Parse(cp.Status.URL)
	if err != nil || u.Host == "" {
		h.Error = "status.url is not a valid URL"
		return h
	}
	ctx, cancel := context.WithTimeout(ctx, coderdProbeTimeout)
	defer cancel()
	start := time.Now()
	cl := coderapi.NewClient(u, "", coderdProbeTimeout, coderapi.ForControlPlaneTarget(cp.Namespace, cp.Name, metrics.ComponentMCP))
	defer cl.HTTPClient.CloseIdleConnections()
	info, err := cl.BuildInfo(ctx)
	h.LatencyMs = time.Since(start).Milliseconds()
	if err != nil {
		h.Error = "GET /api/v2/buildinfo: " + coderapi.Message(err)
		if errors.Is(err, context.DeadlineExceeded) {
			h.Error = fmt.Sprintf("GET /api/v2/buildinfo: no answer within %s", coderdProbeTimeout)
		}
		return h
	}
	h.Reachable, h.Version = true, info.Version
	return h
}
