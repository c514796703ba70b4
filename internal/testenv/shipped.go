package testenv

import (
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// shippedSourceDirs are the directories, at the repository root, whose Go
// files make up the coder-k8s binary (with go.mod and go.sum).
var shippedSourceDirs = []string{"api", "cmd", "internal"}

// ShippedBinary returns coder-k8s in BinDir once it is the binary `make
// build` ships, built from the sources as they are: the e2e tests and
// benchmarks run it, so that what they measure (memory, start-up) is what
// users run. Otherwise the error names `make build`.
func ShippedBinary() (string, error) {
	dir, err := BinDir()
	if err != nil {
		return "", err
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "coder-k8s")
	if err := checkShipped(p, root); err != nil {
		return "", err
	}
	return p, nil
}

// checkShipped fails unless path is a Go binary built as `make build`
// builds it (CGO_ENABLED=0, -trimpath, -ldflags with -s -w) and no Go
// source of the binary under root, go.mod or go.sum changed after it.
func checkShipped(path, root string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s not found: run `make build`", path)
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s is not a Go binary (%v): run `make build`", path, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	// Go leaves -ldflags out of the build information of a -trimpath
	// build, so -s -w are read from the ELF file: no symbol table, no DWARF.
	stripped, err := strippedELF(path)
	if err != nil {
		return fmt.Errorf("%s: %w: run `make build`", path, err)
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" || !stripped {
		return fmt.Errorf("%s was not built as `make build` builds it (CGO_ENABLED=%q, -trimpath=%q, symbols and DWARF stripped=%v; want CGO_ENABLED=0 -trimpath -ldflags '-s -w'): run `make build`",
			path, settings["CGO_ENABLED"], settings["-trimpath"], stripped)
	}
	newer, err := newestSource(root, fi.ModTime().UnixNano())
	if err != nil {
		return err
	}
	if newer != "" {
		return fmt.Errorf("%s is older than %s: run `make build`", path, newer)
	}
	return nil
}

// strippedELF reports whether the ELF file at path has neither a symbol
// table nor DWARF sections (what -ldflags '-s -w' leaves out).
func strippedELF(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, fmt.Errorf("read ELF file: %w", err)
	}
	defer f.Close()
	for _, s := range f.Sections {
		if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
			return false, nil
		}
	}
	return true, nil
}

// errFound stops the walk at the first source newer than the binary.
var errFound = errors.New("found")

// newestSource returns a source file of the binary under root modified
// after the time since (Unix nanoseconds), or "" if there is none.
func newestSource(root string, since int64) (string, error) {
	newer := ""
	check := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("check whether the coder-k8s binary is stale: %w", err)
		}
		if fi.ModTime().UnixNano() > since {
			newer, _ = filepath.Rel(root, p)
			return errFound
		}
		return nil
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := check(filepath.Join(root, f)); err != nil {
			if errors.Is(err, errFound) {
				return newer, nil
			}
			return "", err
		}
	}
	for _, d := range shippedSourceDirs {
		err := filepath.WalkDir(filepath.Join(root, d), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return nil
			}
			return check(p)
		})
		if errors.Is(err, errFound) {
			return newer, nil
		}
		if err != nil {
			return "", fmt.Errorf("check whether the coder-k8s binary is stale: %w", err)
		}
	}
	return "", nil
}
