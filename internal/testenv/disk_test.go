package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// TestRequireFreeSpace checks the free space of a real 4 MiB filesystem
// (a tmpfs): 3 MiB is there, 8 MiB is refused with a message saying how
// much is needed and how much is free.
func TestRequireFreeSpace(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a 4 MiB tmpfs (the tests run as root, as make test does): %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	if err := RequireFreeSpace(dir, 3<<20, "a test"); err != nil {
		t.Errorf("3 MiB on a 4 MiB filesystem: %v", err)
	}
	err := RequireFreeSpace(dir, 8<<20, "a test")
	want := fmt.Sprintf("a test needs 8 MiB free on the filesystem of %s, which has 4 MiB: free some (old test runs' and fresh clones' directories under %s are the usual cause)", dir, os.TempDir())
	if err == nil || err.Error() != want {
		t.Errorf("8 MiB on a 4 MiB filesystem: %v, want %q", err, want)
	}
}
