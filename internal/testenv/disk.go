package testenv

import (
	"fmt"
	"os"
	"syscall"
)

// RequireFreeSpace fails unless the filesystem holding dir has at least
// need bytes free for what is about to be written there (what, for the
// message). A full disk otherwise shows minutes later as something else:
// a node's image pull backing off, a pod that never starts.
func RequireFreeSpace(dir string, need uint64, what string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", dir, err)
	}
	if free := st.Bavail * uint64(st.Bsize); free < need {
		return fmt.Errorf("%s needs %d MiB free on the filesystem of %s, which has %d MiB: free some (old test runs' and fresh clones' directories under %s are the usual cause)",
			what, need>>20, dir, free>>20, os.TempDir())
	}
	return nil
}
