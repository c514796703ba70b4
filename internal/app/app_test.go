package app

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/coder/coder-k8s/internal/config"
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
