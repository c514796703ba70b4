package testenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// controllerManagerStartTimeout bounds the wait for kube-controller-manager
// to serve /healthz with its controllers built; it normally takes a few
// seconds.
const controllerManagerStartTimeout = 60 * time.Second

// StartControllerManager runs the real kube-controller-manager against k
// with only the named controllers (kube-controller-manager --controllers
// names or aliases, for example "namespace" or "garbage-collector"; none
// means its default, every on-by-default controller). It authenticates as
// the admin user for everything, without leader election, service account
// credentials, cloud provider or service account signing key (so the
// serviceaccount-token controller never runs), and serves HTTPS on a free
// loopback port with a self-signed certificate kept in a directory under
// k.Dir.
//
// It returns once /healthz answers ok and lists the controllers' checks,
// that is once the controllers are built and starting. The caller stops the
// process (Process.Stop); KubeAPI.Stop removes its directory and log.
func (k *KubeAPI) StartControllerManager(ctx context.Context, controllers ...string) (*Process, error) {
	Sweep()
	bin, err := Binary("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	if k.KubeconfigPath == "" || k.Dir == "" {
		return nil, errors.New("start kube-controller-manager: the KubeAPI is not running")
	}
	dir, err := os.MkdirTemp(k.Dir, "kube-controller-manager-")
	if err != nil {
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	certDir := filepath.Join(dir, "certs")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	// FreePort leaves a window in which another process can take the port;
	// on that (rare) race, try again with a new one.
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		logPath := filepath.Join(dir, "kube-controller-manager-"+strconv.Itoa(attempt)+".log")
		p, err := k.runControllerManager(ctx, bin, certDir, logPath, port, controllers)
		if err == nil {
			return p, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
	}
}

func (k *KubeAPI) runControllerManager(ctx context.Context, bin, certDir, logPath string, port int, controllers []string) (*Process, error) {
	args := []string{
		"--kubeconfig=" + k.KubeconfigPath,
		// The same admin identity checks callers of its HTTPS endpoints
		// (/healthz, /readyz and /livez are allowed to anyone anyway).
		"--authentication-kubeconfig=" + k.KubeconfigPath,
		"--authorization-kubeconfig=" + k.KubeconfigPath,
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + certDir,
	}
	if len(controllers) > 0 {
		args = append(args, "--controllers="+strings.Join(controllers, ","))
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = filepath.Dir(certDir)
	// Only the flags above configure it: no in-cluster config, no KUBECONFIG.
	cmd.Env = filterEnv(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_")
	p, err := StartProcess("kube-controller-manager", cmd, logPath)
	if err != nil {
		return nil, err
	}

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	healthz := "https://" + addr + "/healthz?verbose"
	serving := []byte("Serving securely on " + addr)
	client := &http.Client{
		Timeout: 5 * time.Second,
		// Its certificate is self-signed, generated at start: the probe
		// alone skips verification; the log line below says who answers.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer client.CloseIdleConnections()
	err = p.WaitReady(ctx, controllerManagerStartTimeout, func(ctx context.Context) error {
		// Another process could hold the port and answer: require
		// kube-controller-manager's own word that it serves there.
		if log, _ := os.ReadFile(logPath); !bytes.Contains(log, serving) {
			return errors.New("kube-controller-manager is not serving yet")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, healthz, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz: %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		if !controllerChecksListed(string(body)) {
			// Until its controllers are built, /healthz has only the ping
			// check; each built controller adds its own.
			return errors.New("/healthz lists no controller yet")
		}
		return nil
	})
	if err != nil {
		p.Stop(5 * time.Second)
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	return p, nil
}

// controllerChecksListed reports whether a verbose /healthz answer of
// kube-controller-manager names a check other than ping, which it has only
// once BuildControllers has registered the controllers' checks.
func controllerChecksListed(verbose string) bool {
	for _, line := range strings.Split(verbose, "\n") {
		if name, ok := strings.CutPrefix(line, "[+]"); ok && !strings.HasPrefix(name, "ping ") {
			return true
		}
	}
	return false
}

// NewControllerManager runs kube-controller-manager with the named
// controllers for a test (see StartControllerManager) and stops it when the
// test ends, before the KubeAPI when that was started first. It fails the
// test if the binary is missing (naming `make tools`) or it does not become
// healthy.
func (k *KubeAPI) NewControllerManager(t testing.TB, controllers ...string) *Process {
	t.Helper()
	p, err := k.StartControllerManager(t.Context(), controllers...)
	if err != nil {
		t.Fatalf("kube-controller-manager: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// Its directory and log go with the KubeAPI: keep the tail.
			t.Logf("kube-controller-manager log tail:\n%s", p.LogTail(50))
		}
		p.Stop(10 * time.Second)
	})
	return p
}
