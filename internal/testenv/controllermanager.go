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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// componentStartTimeout bounds the wait for kube-controller-manager (with
// its controllers built) or kube-scheduler to serve /healthz; they
// normally take a few seconds.
const componentStartTimeout = 60 * time.Second

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
	if k.KubeconfigPath == "" || k.Dir == "" {
		return nil, errors.New("start kube-controller-manager: the KubeAPI is not running")
	}
	args := []string{
		"--kubeconfig=" + k.KubeconfigPath,
		// The same admin identity checks callers of its HTTPS endpoints
		// (/healthz, /readyz and /livez are allowed to anyone anyway).
		"--authentication-kubeconfig=" + k.KubeconfigPath,
		"--authorization-kubeconfig=" + k.KubeconfigPath,
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		// Published in every namespace as kube-root-ca.crt, which pods use
		// to verify kube-apiserver.
		"--root-ca-file=" + k.ServingCAPath,
	}
	if len(controllers) > 0 {
		args = append(args, "--controllers="+strings.Join(controllers, ","))
	}
	return k.startSecureComponent(ctx, "kube-controller-manager", args, func(verbose string) error {
		if !controllerChecksListed(verbose) {
			// Until its controllers are built, /healthz has only the ping
			// check; each built controller adds its own.
			return errors.New("/healthz lists no controller yet")
		}
		return nil
	})
}

// startSecureComponent runs a control plane component (kube-controller-
// manager, kube-scheduler) from bin/ with args plus its HTTPS serving on a
// free loopback port and a self-signed certificate in a directory under
// k.Dir. It returns once the component says it serves there and its
// verbose /healthz answers ok and passes ready (nil: no further check).
func (k *KubeAPI) startSecureComponent(ctx context.Context, name string, args []string, ready func(verboseHealthz string) error) (*Process, error) {
	bin, err := Binary(name)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(k.Dir, name+"-")
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	certDir := filepath.Join(dir, "certs")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	// FreePort leaves a window in which another process can take the port;
	// on that (rare) race, try again with a new one.
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		logPath := filepath.Join(dir, name+"-"+strconv.Itoa(attempt)+".log")
		cmd := exec.Command(bin, append(slices.Clone(args),
			"--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--cert-dir="+certDir)...)
		cmd.Dir = dir
		// Only the flags configure it: no in-cluster config, no KUBECONFIG.
		cmd.Env = filterEnv(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_")
		p, err := StartProcess(name, cmd, logPath)
		if err != nil {
			return nil, err
		}
		err = waitSecureServing(ctx, p, port, ready)
		if err == nil {
			return p, nil
		}
		p.Stop(5 * time.Second)
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	}
}

// waitSecureServing waits until p says it serves HTTPS on the loopback
// port and its verbose /healthz answers ok and passes ready.
func waitSecureServing(ctx context.Context, p *Process, port int, ready func(string) error) error {
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
	return p.WaitReady(ctx, componentStartTimeout, func(ctx context.Context) error {
		// Another process could hold the port and answer: require the
		// component's own word that it serves there.
		if log, _ := os.ReadFile(p.LogPath); !bytes.Contains(log, serving) {
			return errors.New(p.Name + " is not serving yet")
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
		if ready != nil {
			return ready(string(body))
		}
		return nil
	})
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
