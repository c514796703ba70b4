package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/coder/coder-k8s/internal/aggregated/admission"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/kubecache"
)

func TestEveryModeHasARunner(t *testing.T) {
	for _, m := range config.AppModes {
		if modes[m] == nil {
			t.Errorf("mode %q has no runner", m)
		}
	}
	if len(modes) != len(config.AppModes) {
		t.Errorf("runners for %d modes, config knows %d", len(modes), len(config.AppModes))
	}
}

func TestUnknownModeIsAClearError(t *testing.T) {
	cfg := config.Default()
	cfg.App = "everything"
	err := Run(context.Background(), &cfg, logr.Discard())
	if err == nil {
		t.Fatal("Run succeeded with an unknown mode")
	}
	for _, want := range []string{`"everything"`, "all, controller, aggregated-apiserver, mcp-http"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// The manager of the controller and all modes caches only what coder-k8s
// labels and reads Secrets uncached (package kubecache, whose test runs it
// against a real kube-apiserver).
func TestManagerCachesOnlyOwnedObjects(t *testing.T) {
	cfg := config.Default()
	opts := managerOptions(&cfg, logr.Discard())
	if got, want := fmt.Sprint(opts.Cache.DefaultLabelSelector), kubecache.Selector().String(); got != want {
		t.Errorf("cache label selector = %q, want %q", got, want)
	}
	if opts.Cache.DefaultTransform == nil {
		t.Error("no cache transform: managedFields and last-applied annotations would be cached")
	}
	if opts.Client.Cache == nil || len(opts.Client.Cache.DisableFor) != 3 {
		t.Fatalf("client cache options = %+v, want Secrets, pods and events read uncached", opts.Client.Cache)
	}
	_, secret := opts.Client.Cache.DisableFor[0].(*corev1.Secret)
	_, pod := opts.Client.Cache.DisableFor[1].(*corev1.Pod)
	_, event := opts.Client.Cache.DisableFor[2].(*corev1.Event)
	if !secret || !pod || !event {
		t.Errorf("client reads %T uncached, want Secrets, pods and events", opts.Client.Cache.DisableFor)
	}
}

// The components' options carry the configuration file's values.
func TestComponentOptionsFromConfig(t *testing.T) {
	cfg := config.Default()
	adm := &admission.Options{}
	a := apiServerOptions(cfg.AggregatedAPIServer, adm)
	wantWait := templatesource.WaitConfig{Timeout: 25 * time.Minute, BackoffAfter: 2 * time.Minute, InitialPollInterval: 2 * time.Second, MaxPollInterval: 10 * time.Second}
	if a.BuildWait != wantWait {
		t.Errorf("BuildWait = %+v, want %+v", a.BuildWait, wantWait)
	}
	if a.BindAddress != "0.0.0.0" || a.SecurePort != 6443 || a.RequestTimeout != 30*time.Minute || a.WatchPollInterval != 5*time.Second {
		t.Errorf("aggregated API server options = %+v", a)
	}
	if a.Admission != adm {
		t.Error("admission enabled, but the server gets no admission options")
	}
	cfg.AggregatedAPIServer.Admission.Enabled = false
	if a := apiServerOptions(cfg.AggregatedAPIServer, adm); a.Admission != nil {
		t.Error("admission disabled, but the server gets admission options")
	}

	cfg.AggregatedAPIServer.Coder.StaticBackend.Identity.Mappings = []config.IdentityMapping{{KubernetesUser: "system:admin", CoderUser: "admin"}}
	s := staticOptions(cfg.AggregatedAPIServer.Coder)
	if s.CoderTimeout != 30*time.Second || s.Identity.Mode != identity.ModeMapped || s.Identity.MatchField != identity.MatchEmail ||
		len(s.Identity.Mappings) != 1 || s.Identity.Mappings[0] != (identity.Mapping{KubernetesUser: "system:admin", CoderUser: "admin"}) {
		t.Errorf("static backend options = %+v", s)
	}

	m := mcpOptions(cfg.MCP)
	if m.AuthNone || m.MaxRequestBytes != 1<<20 || m.ReadHeaderTimeout != 10*time.Second || m.ToolTimeout != 2*time.Minute {
		t.Errorf("MCP options = %+v", m)
	}
	cfg.MCP.Auth = config.MCPAuthNone
	if !mcpOptions(cfg.MCP).AuthNone {
		t.Error("mcp.auth none, but AuthNone is false")
	}
}
