package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCheckShipped builds a small program the way `make build` builds
// coder-k8s and the way plain `go build` does, and checks what
// checkShipped says of each, of a missing binary and of a source changed
// after the build.
func TestCheckShipped(t *testing.T) {
	root := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/shipped\n\ngo 1.22\n")
	write("go.sum", "")
	write("cmd/x/main.go", "package main\n\nfunc main() {}\n")
	write("internal/y/y_test.go", "package y\n")
	write("api/z.go", "package z\n")
	build := func(name string, env []string, args ...string) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("go", append(append([]string{"build"}, args...), "-o", out, "./cmd/x")...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		return out
	}
	shipped := build("shipped", []string{"CGO_ENABLED=0"}, "-trimpath", "-ldflags", "-s -w -X main.v=1")
	plain := build("plain", []string{"CGO_ENABLED=1"})
	unstripped := build("unstripped", []string{"CGO_ENABLED=0"}, "-trimpath")

	if err := checkShipped(shipped, root); err != nil {
		t.Errorf("binary built as make build builds it: %v", err)
	}
	err := checkShipped(plain, root)
	if err == nil || !strings.Contains(err.Error(), "was not built as `make build` builds it") || !strings.Contains(err.Error(), "run `make build`") {
		t.Errorf("plain go build: error = %v, want one saying it was not built as `make build` builds it", err)
	}
	err = checkShipped(unstripped, root)
	if err == nil || !strings.Contains(err.Error(), "symbols and DWARF stripped=false") {
		t.Errorf("build without -ldflags '-s -w': error = %v, want one saying it is not stripped", err)
	}
	err = checkShipped(filepath.Join(root, "missing"), root)
	if err == nil || !strings.Contains(err.Error(), "not found: run `make build`") {
		t.Errorf("missing binary: error = %v, want one naming `make build`", err)
	}

	// A test file changed after the build does not make the binary stale;
	// a source file does.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(root, "internal/y/y_test.go"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := checkShipped(shipped, root); err != nil {
		t.Errorf("after a test file changed: %v", err)
	}
	if err := os.Chtimes(filepath.Join(root, "api/z.go"), later, later); err != nil {
		t.Fatal(err)
	}
	err = checkShipped(shipped, root)
	if err == nil || err.Error() != shipped+" is older than "+filepath.Join("api", "z.go")+": run `make build`" {
		t.Errorf("after api/z.go changed: error = %v, want it named and `make build`", err)
	}
}
