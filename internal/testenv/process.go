package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ownerEnv marks every process the test stack starts with the PID of the
// process that owns it, so that a later run can find and stop what a killed
// run left behind (see Sweep).
const ownerEnv = "CODER_K8S_TESTENV_OWNER"

// BinDir is where the pinned binaries live: $CODER_K8S_BIN_DIR, else bin/
// at the repository root.
func BinDir() (string, error) {
	if d := os.Getenv("CODER_K8S_BIN_DIR"); d != "" {
		return filepath.Abs(d)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin"), nil
}

// RepoRoot finds the coder-k8s repository root above the working directory
// (tests run in their package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repository root: %w", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.HasPrefix(b, []byte("module github.com/coder/coder-k8s\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the coder-k8s repository root above the working directory (set CODER_K8S_BIN_DIR)")
		}
		dir = parent
	}
}

// Binary returns the path of a pinned binary, or an error telling the user
// how to build it.
func Binary(name string) (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found in %s: run `make tools` to build the test binaries", name, dir)
	}
	return p, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) { return freePortOn("127.0.0.1") }

// The ports FreePort hands out lie below the kernel's ephemeral range
// (ip_local_port_range, 32768-60999 by default), where every outgoing
// connection takes its local port, and below Kubernetes' NodePort range
// (30000-32767). A port the kernel picks for net.Listen(":0") comes from
// the ephemeral range, so any of the suites' many outgoing connections
// could take it between the check and the server's own bind: CI saw the
// operator's aggregated port taken so. Only another FreePort caller can
// still race for one of these, at random among 10,000.
const freePortLow, freePortHigh = 20000, 30000

// freePortOn returns a TCP port on host that was free a moment ago and
// that no FreePort caller on this machine was handed within portHold.
func freePortOn(host string) (int, error) {
	Sweep()
	var err error
	for range 200 {
		port := freePortLow + rand.IntN(freePortHigh-freePortLow)
		if !reservePort(port) {
			continue
		}
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	if err == nil {
		err = errors.New("every port tried is reserved")
	}
	return 0, fmt.Errorf("find a free port on %s between %d and %d: %w", host, freePortLow, freePortHigh-1, err)
}

// portHold is how long a port FreePort handed out stays reserved: its
// caller binds it later, seconds later for the operator (whose RBAC is
// applied in between), and meanwhile the check alone would hand it to
// another caller, in this test process or in another package's running
// beside it. CI saw the operator's aggregated port taken so.
const portHold = 10 * time.Minute

// portsDir holds one file per port reserved, named by the port.
func portsDir() string { return filepath.Join(stackRoot(), "ports") }

// reservePort claims port for this caller among every FreePort caller on
// the machine: false when another claimed it less than portHold ago.
// Sweep removes older claims.
func reservePort(port int) bool {
	if err := os.MkdirAll(portsDir(), 0o755); err != nil {
		return true // no claims: the bind check alone decides
	}
	f, err := os.OpenFile(filepath.Join(portsDir(), strconv.Itoa(port)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return !errors.Is(err, fs.ErrExist)
	}
	_ = f.Close()
	return true
}

// sweepPorts removes the port claims older than portHold.
func sweepPorts() {
	claims, _ := os.ReadDir(portsDir())
	for _, c := range claims {
		if info, err := c.Info(); err == nil && time.Since(info.ModTime()) > portHold {
			_ = os.Remove(filepath.Join(portsDir(), c.Name()))
		}
	}
}

// Process is a component of the test stack running as a child process.
type Process struct {
	Name    string
	LogPath string
	// Started is when the process was started (just before exec), for
	// timing it from its own start only.
	Started time.Time

	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
	once sync.Once
}

// StartProcess starts cmd with its output in logPath. The child is killed
// if this process dies (Pdeathsig), and carries ownerEnv so Sweep can find
// it should that fail.
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, ownerEnv+"="+strconv.Itoa(os.Getpid()))
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
	started := time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, Started: started, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// PID is the process's ID (for reading /proc/<pid>).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process itself (not its group), as a container
// runtime does to PID 1.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process to end.
func (p *Process) Stop(grace time.Duration) {
	p.once.Do(func() {
		pgid := -p.cmd.Process.Pid
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(pgid, syscall.SIGKILL)
			<-p.done
		}
	})
}

// LogTail returns the last n lines of the process's output.
func (p *Process) LogTail(n int) string { return LogTail(p.LogPath, n) }

// LogTail returns the last n lines of a log file.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitReady polls check until it succeeds, the process exits, or timeout
// passes; failures carry the process's log tail so the cause is visible.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%s exited before it was ready (%v); log tail:\n%s", p.Name, err, p.LogTail(30))
		}
		if last = check(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; log tail:\n%s", p.Name, timeout, last, p.LogTail(30))
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitFor polls check every 100 ms until it succeeds, and fails the test
// with check's last error when timeout passes first.
func WaitFor(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stackRoot holds every data directory the test stack creates, one
// directory per owning process, so Sweep can remove what dead owners left.
func stackRoot() string { return filepath.Join(os.TempDir(), "coder-k8s-testenv") }

// newStackDir makes a private directory for one component of this run.
func newStackDir(name string) (string, error) {
	base := filepath.Join(stackRoot(), strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("create test stack directory: %w", err)
	}
	dir, err := os.MkdirTemp(base, name+"-")
	if err != nil {
		return "", fmt.Errorf("create %s directory: %w", name, err)
	}
	return dir, nil
}

// removeStackDir removes a component's directory, and this process's
// directory under stackRoot once it is empty.
func removeStackDir(dir string) {
	unmountUnder(dir)
	_ = os.RemoveAll(dir)
	_ = os.Remove(filepath.Dir(dir)) // fails, as intended, while not empty
}

var sweepOnce sync.Once

// Sweep stops processes and removes directories left by earlier runs whose
// owning process is gone (a test binary killed by a timeout or SIGKILL), so
// every run starts clean. It runs once per process, from every Start*.
func Sweep() {
	sweepOnce.Do(func() {
		// Children inherit the marker, so envtest's kube-apiserver and
		// etcd carry it too.
		_ = os.Setenv(ownerEnv, strconv.Itoa(os.Getpid()))
		sweep()
	})
}

// sweep is Sweep's work, every time it is called.
func sweep() {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, envPath := range procs {
		b, err := os.ReadFile(envPath)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(envPath)))
		if pid == os.Getpid() {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			owner, ok := strings.CutPrefix(string(kv), ownerEnv+"=")
			if !ok {
				continue
			}
			if o, err := strconv.Atoi(owner); err == nil && o != pid && !alive(o) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			break
		}
	}
	sweepPorts()
	// A dead owner's node: its containers carry no marker, but they
	// live in the node's network namespaces.
	sweepNodeNetworks()
	dirs, _ := os.ReadDir(stackRoot())
	for _, d := range dirs {
		if o, err := strconv.Atoi(d.Name()); err == nil && !alive(o) {
			dir := filepath.Join(stackRoot(), d.Name())
			nodes, _ := filepath.Glob(filepath.Join(dir, "kube-*", "node-*"))
			for _, n := range nodes {
				removeNodeFiles(n)
			}
			unmountUnder(dir)
			_ = os.RemoveAll(dir)
		}
	}
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// FilterEnv returns env without the variables whose names start with one
// of prefixes.
func FilterEnv(env []string, prefixes ...string) []string {
	out := make([]string, 0, len(env))
next:
	for _, kv := range env {
		for _, prefix := range prefixes {
			if strings.HasPrefix(kv, prefix) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return out
}

// RunOutput runs a command and returns its combined output; the error
// carries the command line.
func RunOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
