// Package stack runs the project's local stack for the GitOps engine suites
// (test/gitops/argocd, test/gitops/flux). The Argo CD suite is a Go module
// of its own, pinned to the Kubernetes libraries gitops-engine builds with,
// so it cannot import internal/testenv; both suites run hack/dev instead,
// the program behind `make dev`, built from the main module with
// internal/testenv: kube-apiserver with the aggregation layer and etcd,
// kube-controller-manager, PostgreSQL and coderd (OpenTofu provisioner), and
// the shipped coder-k8s binary in mode all serving the aggregated API for a
// CoderControlPlane that adopts coderd. hack/dev writes a ready file once the
// aggregated API serves that control plane's namespace.
//
// Binaries come from $CODER_K8S_BIN_DIR (the Makefile sets it to bin/):
// dev and coder-k8s (`make build build-dev`), and the pinned tools
// (`make tools`).
package stack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds the whole stack start; it normally takes well under a
// minute.
const startTimeout = 5 * time.Minute

// Stack is a running hack/dev.
type Stack struct {
	// Kubeconfig is the admin kubeconfig of kube-apiserver.
	Kubeconfig string
	// CoderURL and SessionToken reach coderd as its first user, Username.
	CoderURL, SessionToken, Username string
	// Namespace is the CoderControlPlane's namespace: the aggregated API
	// serves its Coder objects there.
	Namespace string
	// OperatorLog and DevLog are the logs of coder-k8s and of hack/dev.
	OperatorLog, DevLog string

	binDir string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs hack/dev with a fresh state directory and returns once the
// aggregated API serves the control plane's namespace.
func Start(ctx context.Context) (*Stack, error) {
	binDir := os.Getenv("CODER_K8S_BIN_DIR")
	if binDir == "" {
		return nil, errors.New("CODER_K8S_BIN_DIR is not set: run the suite with `make test-gitops`, or set it to the repository's bin/ after `make tools build build-dev`")
	}
	binDir, err := filepath.Abs(binDir)
	if err != nil {
		return nil, err
	}
	for _, b := range []string{"dev", "coder-k8s", "coder"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run `make tools build build-dev`", b, binDir)
		}
	}
	dir, err := os.MkdirTemp("", "coder-k8s-gitops-")
	if err != nil {
		return nil, err
	}
	s := &Stack{binDir: binDir, dir: dir, DevLog: filepath.Join(dir, "dev.log"), exited: make(chan struct{})}
	logFile, err := os.Create(s.DevLog)
	if err != nil {
		return nil, err
	}
	ready := filepath.Join(dir, "ready.env")
	s.cmd = exec.Command(filepath.Join(binDir, "dev"), "--state-dir", filepath.Join(dir, "state"),
		"--operator", filepath.Join(binDir, "coder-k8s"), "--run", "binary", "--demo=false", "--ready-file", ready)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start hack/dev: %w", err)
	}
	// Owned by the Stack: ends when hack/dev exits, which Stop causes.
	go func() {
		_ = s.cmd.Wait()
		logFile.Close()
		close(s.exited)
	}()

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		b, err := os.ReadFile(ready)
		if err == nil {
			if err := s.parse(b); err != nil {
				return nil, fmt.Errorf("%w (logs kept in %s)", err, s.StopKeepLogs())
			}
			return s, nil
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("hack/dev exited before the stack was ready (logs kept in %s); its log:\n%s", s.dir, tail(s.DevLog, 40))
		case <-ctx.Done():
			log := tail(s.DevLog, 40)
			return nil, fmt.Errorf("the stack was not ready within %s (logs kept in %s); hack/dev's log:\n%s", startTimeout, s.StopKeepLogs(), log)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func (s *Stack) parse(b []byte) error {
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	token, err := os.ReadFile(env["CODER_SESSION_TOKEN_FILE"])
	if err != nil {
		return fmt.Errorf("the stack's session token: %w", err)
	}
	s.Kubeconfig, s.CoderURL, s.Username, s.Namespace, s.OperatorLog =
		env["KUBECONFIG"], env["CODER_URL"], env["CODER_USERNAME"], env["NAMESPACE"], env["OPERATOR_LOG"]
	s.SessionToken = strings.TrimSpace(string(token))
	if s.Kubeconfig == "" || s.CoderURL == "" || s.Username == "" || s.Namespace == "" {
		return fmt.Errorf("incomplete ready file:\n%s", b)
	}
	return nil
}

// Stop stops hack/dev (SIGTERM: it stops coder-k8s, coderd, PostgreSQL,
// kube-controller-manager, kube-apiserver and etcd, and removes their
// directories) and removes the state directory with the logs.
func (s *Stack) Stop() { s.stop(false) }

// StopKeepLogs stops hack/dev like Stop but keeps the state directory (the
// logs of hack/dev and coder-k8s) and returns its path.
func (s *Stack) StopKeepLogs() string {
	s.stop(true)
	return s.dir
}

func (s *Stack) stop(keep bool) {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(2 * time.Minute):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if !keep {
		_ = os.RemoveAll(s.dir)
	}
}

// Coder runs the pinned coder CLI as the stack's first user: a change made
// in Coder directly, as in its UI, not through Kubernetes.
func (s *Stack) Coder(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.binDir, "coder"), args...)
	cmd.Env = append(os.Environ(), "CODER_URL="+s.CoderURL, "CODER_SESSION_TOKEN="+s.SessionToken, "CODER_CONFIG_DIR="+filepath.Join(s.dir, "coder-cli"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("coder %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// OperatorLogTail is the end of coder-k8s's log, for failure messages.
func (s *Stack) OperatorLogTail(n int) string { return tail(s.OperatorLog, n) }

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Tests is a suite's TestMain: it starts the stack, calls setup with it (to
// build clients), runs the tests and stops the stack, keeping its logs when
// something failed. It returns the exit code.
func Tests(m interface{ Run() int }, setup func(*Stack) error) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("-short: the GitOps suites need the real stack (make test-gitops)")
		return 0
	}
	st, err := Start(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the stack:", err)
		return 1
	}
	if err := setup(st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		fmt.Fprintln(os.Stderr, "logs of hack/dev and coder-k8s kept in", st.StopKeepLogs())
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs of hack/dev and coder-k8s kept in", st.StopKeepLogs())
		return code
	}
	st.Stop()
	return code
}
