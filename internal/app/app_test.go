package app

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/coder/coder-k8s/internal/config"
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
	if opts.Client.Cache == nil || len(opts.Client.Cache.DisableFor) != 1 {
		t.Fatalf("client cache options = %+v, want Secrets read uncached", opts.Client.Cache)
	}
	if _, ok := opts.Client.Cache.DisableFor[0].(*corev1.Secret); !ok {
		t.Errorf("client reads %T uncached, want Secrets", opts.Client.Cache.DisableFor[0])
	}
}
