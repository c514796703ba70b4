// Command toolalign makes each pinned tool's Go module require at least the
// main module's version of every module both of them build, so that the
// packages they share (client-go, grpc, x/net, OpenTelemetry, ...) compile to
// the same Go build-cache entries: a cold `make test` then compiles each of
// them once instead of once per tool. A package's cache key covers the
// versions of everything it imports, so a single differing module anywhere
// below a package gives it a second compile.
//
// Versions only go up: a module the tool needs newer than the main module has
// stays as it is. -keep DIR=PREFIX,... leaves a tool's modules under those
// path prefixes alone, for a tool whose libraries must move together at
// their own release: kubectl 1.32 and the Argo CD suite's Kubernetes
// libraries, etcd's server with its own API packages.
//
//	toolalign [-check] [-keep DIR=PREFIX,...]... DIR=PKG[,PKG...] ...
//
// `make align-tools` writes the go.mod and go.sum files; `make
// verify-generate` runs it with -check, which fails naming every module a
// tool builds at an older version than the main module.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"golang.org/x/mod/semver"
)

func main() {
	check := flag.Bool("check", false, "report the modules to raise instead of raising them; exit 1 when there are any")
	keep := map[string][]string{}
	flag.Func("keep", "DIR=PREFIX,...: module path prefixes the tool module in DIR keeps at its own versions (repeatable)", func(v string) error {
		dir, prefixes, ok := strings.Cut(v, "=")
		if !ok || dir == "" || prefixes == "" {
			return errors.New("want DIR=PREFIX[,PREFIX...]")
		}
		keep[dir] = append(keep[dir], splitList(prefixes)...)
		return nil
	})
	flag.Parse()
	if err := run(*check, keep, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "toolalign:", err)
		os.Exit(1)
	}
}

func run(check bool, keep map[string][]string, tools []string) error {
	if len(tools) == 0 {
		return errors.New("no tool modules given (DIR=PKG[,PKG...])")
	}
	main, err := buildList(".", []string{"./..."})
	if err != nil {
		return fmt.Errorf("main module: %w", err)
	}
	stale := 0
	for _, t := range tools {
		dir, pkgs, ok := strings.Cut(t, "=")
		if !ok || dir == "" || pkgs == "" {
			return fmt.Errorf("%q: want DIR=PKG[,PKG...]", t)
		}
		// Raising one module can bring in another the main module has
		// newer, so raise until nothing is behind.
		raised := 0
		for {
			tool, err := buildList(dir, splitList(pkgs))
			if err != nil {
				return fmt.Errorf("%s: %w", dir, err)
			}
			raise := behind(tool, main, keep[dir])
			if len(raise) == 0 {
				break
			}
			if check {
				stale += len(raise)
				for _, r := range raise {
					fmt.Printf("%s: %s %s, the main module has %s\n", dir, r.path, tool[r.path].version, r.version)
				}
				break
			}
			if raised > 0 && len(raise) >= raised {
				return fmt.Errorf("%s: %d modules stay behind the main module's versions after go mod tidy", dir, len(raise))
			}
			if err := require(dir, raise); err != nil {
				return fmt.Errorf("%s: %w", dir, err)
			}
			raised = len(raise)
			fmt.Printf("%s: raised %d modules to the main module's versions\n", dir, len(raise))
		}
	}
	if stale > 0 {
		return fmt.Errorf("%d tool dependencies are older than the main module's (their packages compile twice); run make align-tools", stale)
	}
	return nil
}

type module struct{ path, version string }

// behind lists the modules tool builds at an older version than main does,
// but those under a kept prefix. A module the tool replaces is left alone
// too: its go.mod pins it on purpose (Kubernetes' staging modules, Coder's
// forks).
func behind(tool map[string]built, main map[string]built, keep []string) []module {
	var out []module
	for path, b := range tool {
		mv := main[path].version
		if b.replaced || b.version == "" || mv == "" || semver.Compare(mv, b.version) <= 0 {
			continue
		}
		if slices.ContainsFunc(keep, func(prefix string) bool { return strings.HasPrefix(path, prefix) }) {
			continue
		}
		out = append(out, module{path, mv})
	}
	slices.SortFunc(out, func(a, b module) int { return strings.Compare(a.path, b.path) })
	return out
}

// built is the version of a module that is compiled: a replaced module's
// replacement's.
type built struct {
	version  string
	replaced bool
}

// buildList is every module that provides a package the patterns (and their
// tests) build without cgo, as the Makefile builds.
func buildList(dir string, patterns []string) (map[string]built, error) {
	args := append([]string{"list", "-deps", "-test", "-f",
		"{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	// A replace of one version only (tofu's of hcl/v2 v2.20.1) stops
	// applying when the version moves, so any replace of a path pins it.
	replaces, err := replacedPaths(dir)
	if err != nil {
		return nil, err
	}
	mods := map[string]built{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if path, version, ok := strings.Cut(sc.Text(), " "); ok && version != "" {
			mods[path] = built{version: version, replaced: replaces[path]}
		}
	}
	return mods, sc.Err()
}

// replacedPaths is every module path dir's go.mod replaces, at any version.
func replacedPaths(dir string) (map[string]bool, error) {
	cmd := exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod edit -json: %w", err)
	}
	var mod struct {
		Replace []struct{ Old struct{ Path string } }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return nil, fmt.Errorf("go mod edit -json: %w", err)
	}
	paths := map[string]bool{}
	for _, r := range mod.Replace {
		paths[r.Old.Path] = true
	}
	return paths, nil
}

func require(dir string, mods []module) error {
	args := []string{"mod", "edit"}
	for _, m := range mods {
		args = append(args, "-require="+m.path+"@"+m.version)
	}
	for _, args := range [][]string{args, {"mod", "tidy"}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w: %s", args[0]+" "+args[1], err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
