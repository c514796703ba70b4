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

// ControllerManagerOptions configures StartControllerManagerWith.
type ControllerManagerOptions struct {
	// Controllers are kube-controller-manager --controllers names or
	// aliases, for example "namespace" or "garbage-collector"; none means
	// its default, every on-by-default controller.
	Controllers []string
	// ServiceAccountCredentials runs kube-controller-manager as kubeadm and
	// managed clusters do: as user system:kube-controller-manager (a client
	// certificate, with the RBAC kube-apiserver bootstraps for it), with
	// --use-service-account-credentials, so that each controller calls
	// kube-apiserver as its own ServiceAccount in kube-system (for example
	// system:serviceaccount:kube-system:generic-garbage-collector, with a
	// token from the TokenRequest API) with the bootstrap role
	// system:controller:<name>, and with the service account signing key,
	// as kubeadm passes it, so the token controller runs too. The shared
	// informers (the garbage collector's lists and watches among them)
	// stay with system:kube-controller-manager. Off: everything as the
	// admin user (system:masters).
	ServiceAccountCredentials bool
}

// controllerManagerUser is the user kube-apiserver's bootstrap RBAC grants
// kube-controller-manager's own rights to (ClusterRoleBinding
// system:kube-controller-manager).
const controllerManagerUser = "system:kube-controller-manager"

// StartControllerManager runs the real kube-controller-manager against k
// with only the named controllers, as the admin user (see
// StartControllerManagerWith).
func (k *KubeAPI) StartControllerManager(ctx context.Context, controllers ...string) (*Process, error) {
	return k.StartControllerManagerWith(ctx, ControllerManagerOptions{Controllers: controllers})
}

// StartControllerManagerWith runs the real kube-controller-manager against
// k with the controllers and identity opts name, without leader election
// or cloud provider, serving HTTPS on a free loopback port with a
// self-signed certificate kept in a directory under k.Dir. As the admin
// user it has no service account signing key (so the serviceaccount-token
// controller never runs); with opts.ServiceAccountCredentials it runs as
// clusters run it.
//
// It returns once /healthz answers ok and lists the controllers' checks,
// that is once the controllers are built and starting. The caller stops the
// process (Process.Stop); KubeAPI.Stop removes its directory and log.
func (k *KubeAPI) StartControllerManagerWith(ctx context.Context, opts ControllerManagerOptions) (*Process, error) {
	Sweep()
	if k.KubeconfigPath == "" || k.Dir == "" {
		return nil, errors.New("start kube-controller-manager: the KubeAPI is not running")
	}
	kubeconfig := k.KubeconfigPath
	args := []string{
		"--leader-elect=false",
		// Published in every namespace as kube-root-ca.crt, which pods use
		// to verify kube-apiserver.
		"--root-ca-file=" + k.ServingCAPath,
	}
	if opts.ServiceAccountCredentials {
		if k.env == nil {
			return nil, errors.New("start kube-controller-manager: the KubeAPI is not running")
		}
		var err error
		if kubeconfig, err = k.controllerManagerKubeconfig(); err != nil {
			return nil, fmt.Errorf("start kube-controller-manager: %w", err)
		}
		args = append(args, "--use-service-account-credentials=true",
			// The key kube-apiserver verifies service account tokens with
			// (envtest's sa-signer in its certificate directory): the token
			// controller fills Secrets of type service-account-token.
			"--service-account-private-key-file="+filepath.Join(k.env.ControlPlane.GetAPIServer().CertDir, "sa-signer.key"))
	} else {
		args = append(args, "--use-service-account-credentials=false")
	}
	// The same identity checks callers of its HTTPS endpoints (/healthz,
	// /readyz and /livez are allowed to anyone anyway).
	args = append(args, "--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig)
	if len(opts.Controllers) > 0 {
		args = append(args, "--controllers="+strings.Join(opts.Controllers, ","))
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

// controllerManagerKubeconfig writes a kubeconfig authenticating as
// system:kube-controller-manager with a client certificate to a new file
// under k.Dir and returns its path.
func (k *KubeAPI) controllerManagerKubeconfig() (string, error) {
	b, err := k.UserKubeconfig(controllerManagerUser)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(k.Dir, "kube-controller-manager-*.kubeconfig")
	if err != nil {
		return "", err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return "", err
	}
	return f.Name(), f.Close()
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
		cmd.Env = FilterEnv(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_")
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

// StartScheduler runs the real kube-scheduler against k as the admin
// user, without leader election, serving HTTPS on a free loopback port
// like StartControllerManagerWith. It returns once /healthz answers ok;
// the caller stops the process.
func (k *KubeAPI) StartScheduler(ctx context.Context) (*Process, error) {
	Sweep()
	if k.KubeconfigPath == "" || k.Dir == "" {
		return nil, errors.New("start kube-scheduler: the KubeAPI is not running")
	}
	return k.startSecureComponent(ctx, "kube-scheduler", []string{
		"--kubeconfig=" + k.KubeconfigPath,
		"--authentication-kubeconfig=" + k.KubeconfigPath,
		"--authorization-kubeconfig=" + k.KubeconfigPath,
		"--leader-elect=false",
	}, nil)
}

// NewControllerManager runs kube-controller-manager with the named
// controllers as the admin user for a test (see NewControllerManagerWith).
func (k *KubeAPI) NewControllerManager(t testing.TB, controllers ...string) *Process {
	t.Helper()
	return k.NewControllerManagerWith(t, ControllerManagerOptions{Controllers: controllers})
}

// NewControllerManagerWith runs kube-controller-manager as opts say for a
// test (see StartControllerManagerWith) and stops it when the test ends,
// before the KubeAPI when that was started first. It fails the test if the
// binary is missing (naming `make tools`) or it does not become healthy.
func (k *KubeAPI) NewControllerManagerWith(t testing.TB, opts ControllerManagerOptions) *Process {
	t.Helper()
	p, err := k.StartControllerManagerWith(t.Context(), opts)
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
