// Package version reports the build's version, set at link time by the
// Makefile (make build, make image).
package version

import (
	"fmt"
	"runtime"
)

// Set with -ldflags "-X github.com/coder/coder-k8s/internal/version.version=...".
var (
	version = "v0.0.0-dev"
	commit  = "unknown"
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the build's version information.
func Get() Info {
	return Info{
		Version:   version,
		Commit:    commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

func (i Info) String() string {
	return fmt.Sprintf("coder-k8s %s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
