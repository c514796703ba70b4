package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
)

// Kubectl runs a kubectl binary as the tests do: Flags (which cluster and
// credentials, as KubeAPI.KubectlFlags gives them) before each command's
// own arguments.
type Kubectl struct {
	// Path is the kubectl binary.
	Path string
	// Flags come before every command's arguments.
	Flags []string
	// DropEnv are prefixes ("KUBECONFIG=") of the test's environment
	// variables kubectl does not inherit; nil inherits them all.
	DropEnv []string
}

// Kubectl is the kubectl binary at path run against k as the cluster
// admin.
func (k *KubeAPI) Kubectl(path string) Kubectl {
	return Kubectl{Path: path, Flags: k.KubectlFlags()}
}

// KubectlResult is what one run of kubectl wrote and how it exited.
type KubectlResult struct {
	Stdout, Stderr string
	// Combined is stdout and stderr interleaved as kubectl wrote them.
	Combined string
	// ExitCode is kubectl's exit code, -1 when it did not exit by itself
	// (it could not start, or was killed).
	ExitCode int
}

// Command is the command running kubectl with args, stopped when ctx
// ends; for a test that streams its output (a watch) rather than Run it.
func (k Kubectl) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, k.Path, append(slices.Clone(k.Flags), args...)...)
	if k.DropEnv != nil {
		var env []string
		for _, e := range os.Environ() {
			if !slices.ContainsFunc(k.DropEnv, func(prefix string) bool { return strings.HasPrefix(e, prefix) }) {
				env = append(env, e)
			}
		}
		cmd.Env = env
	}
	return cmd
}

// Run runs kubectl with args, reading stdin ("" for none), until it exits
// or ctx ends. A non-zero exit is an error too: one that names the
// command, wraps the *exec.ExitError and carries the combined output, so
// that a test can print it as it is.
func (k Kubectl) Run(ctx context.Context, stdin string, args ...string) (KubectlResult, error) {
	cmd := k.Command(ctx, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	combined := &LockedBuffer{}
	cmd.Stdout = io.MultiWriter(&stdout, combined)
	cmd.Stderr = io.MultiWriter(&stderr, combined)
	err := cmd.Run()
	r := KubectlResult{Stdout: stdout.String(), Stderr: stderr.String(), Combined: combined.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.ExitCode = exit.ExitCode()
	default:
		r.ExitCode = -1
	}
	if err != nil {
		return r, fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, r.Combined)
	}
	return r, nil
}

// LockedBuffer is a buffer that several goroutines may write at once,
// such as those copying a command's stdout and stderr into one.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
