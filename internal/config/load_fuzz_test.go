package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A configuration file is user input: loading never panics; a file that is
// not YAML is refused naming the file, anything else wrong comes back as an
// *Error listing every problem.
func FuzzLoad(f *testing.F) {
	for _, s := range []string{
		"", "apiVersion: config.coder.com/v1alpha1\nkind: CoderK8sConfiguration\n",
		"apiVersion: config.coder.com/v1alpha1\nkind: CoderK8sConfiguration\napp: all\nmcp: {auth: none}\n",
		"app: [1, 2]\n", "controller: {leaderElection: {leaseDuration: soon}}\n", "{{{", "\x00",
		"aggregatedAPIServer:\n  templateBuildWait: {timeout: 45m}\n", "kubernetes: {qps: -1}\n",
		"mcp:\n  allowTools: [a]\n  denyTools: [a]\n", "a: \x01\n", "aggregatedAPIServer: {autoTLS: {enabled: true, secretName: ''}}\n",
	} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(Source{File: path, Environ: []string{}})
		if err == nil {
			if cfg == nil {
				t.Fatal("no error and no configuration")
			}
			return
		}
		var cerr *Error
		switch {
		case errors.As(err, &cerr):
			if len(cerr.Problems) == 0 {
				t.Fatalf("an *Error without problems: %v", err)
			}
		case !strings.Contains(err.Error(), path):
			t.Fatalf("a refused file is not named: %v", err)
		}
	})
}
