package command

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/config"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// `config defaults` output is a valid configuration file as it stands.
func TestDefaultsValidate(t *testing.T) {
	code, out, stderr := run(t, "config", "defaults")
	if code != 0 {
		t.Fatalf("config defaults exited %d: %s", code, stderr)
	}
	for _, want := range []string{"apiVersion: " + config.APIVersion, "kind: " + config.Kind, "app: all"} {
		if !strings.Contains(out, want) {
			t.Errorf("defaults lack %q:\n%s", want, out)
		}
	}
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = run(t, "config", "validate", "--config", file)
	if code != 0 || !strings.Contains(out, "configuration is valid") {
		t.Fatalf("validate of the defaults exited %d: %s%s", code, out, stderr)
	}

	t.Run("misspelled key", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		body := strings.Replace(out0(t), "maxPollInterval:", "maxPolInterval:", 1)
		if err := os.WriteFile(bad, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := run(t, "config", "validate", "--config", bad)
		if code == 0 || !strings.Contains(stderr, "aggregatedAPIServer.templateBuildWait.maxPolInterval: unknown field") {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
	})
	if strings.Contains(stderr, "warning") {
		t.Errorf("validate of the defaults warns:\n%s", stderr)
	}
	t.Run("build wait timeout of 45m: loads, with a deprecation warning", func(t *testing.T) {
		old := filepath.Join(t.TempDir(), "old.yaml")
		body := strings.Replace(out0(t), "timeout: 25m0s", "timeout: 45m", 1)
		if err := os.WriteFile(old, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := run(t, "config", "validate", "--config", old)
		if code != 0 || !strings.Contains(out, "configuration is valid") ||
			!strings.Contains(stderr, "warning: deprecated: aggregatedAPIServer.templateBuildWait.timeout (set in "+old+"): requests no longer wait for template builds") {
			t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, out, stderr)
		}
	})
	t.Run("unknown apiVersion", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		body := strings.Replace(out0(t), config.APIVersion, "config.coder.com/v1", 1)
		if err := os.WriteFile(bad, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := run(t, "config", "validate", "--config", bad)
		if code == 0 || !strings.Contains(stderr, "apiVersion: Unsupported value: config.coder.com/v1") {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
	})
	t.Run("build wait timeout of 45m from the environment", func(t *testing.T) {
		t.Setenv("CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT", "45m")
		code, _, stderr := run(t, "config", "validate", "--config", file)
		if code != 0 || !strings.Contains(stderr, "warning: deprecated: aggregatedAPIServer.templateBuildWait.timeout (set by environment variable CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT)") {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
	})
}

func out0(t *testing.T) string {
	t.Helper()
	code, out, stderr := run(t, "config", "defaults")
	if code != 0 {
		t.Fatalf("config defaults: %s", stderr)
	}
	return out
}

func TestRunRefusesAnUnknownModeBeforeStarting(t *testing.T) {
	code, _, stderr := run(t, "--app", "everything")
	if code != exitUsage || !strings.Contains(stderr, `app: Unsupported value: "everything"`) {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

func TestUnknownFlagIsAUsageError(t *testing.T) {
	code, _, stderr := run(t, "--no-such-flag")
	if code != exitUsage || !strings.Contains(stderr, "no-such-flag") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "coder-k8s v") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}
