package config

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Flag names. --config and --coder-session-token are not configuration keys:
// the first names the file, the second carries a secret that is never
// written to a file.
const (
	FlagConfig            = "config"
	flagCoderSessionToken = "coder-session-token"
)

// flagKeys maps every flag that overrides a configuration key onto it.
var flagKeys = map[string]string{
	"app":                   "app",
	"kubeconfig":            "kubernetes.kubeconfig",
	"log-level":             "logging.level",
	"log-format":            "logging.format",
	"coder-url":             "aggregatedAPIServer.coder.staticBackend.url",
	"coder-namespace":       "aggregatedAPIServer.coder.staticBackend.namespace",
	"coder-request-timeout": "aggregatedAPIServer.coder.requestTimeout",
}

// AddFlags registers the flags that override the configuration file. Their
// defaults are only shown in help: a flag overrides the file only when it is
// set explicitly.
func AddFlags(fs *pflag.FlagSet) {
	d := Default()
	modes := make([]string, len(AppModes))
	for i, m := range AppModes {
		modes[i] = string(m)
	}
	fs.String(FlagConfig, "", "path of the configuration file (apiVersion "+APIVersion+", kind "+Kind+")")
	fs.String("app", string(d.App), fmt.Sprintf("components to run: %s", strings.Join(modes, ", ")))
	fs.String("kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, then in-cluster")
	fs.String("log-level", d.Logging.Level, "log level: debug, info, warn, error")
	fs.String("log-format", d.Logging.Format, "log format: json, console")
	fs.String("coder-url", "", "static coderd URL for the aggregated API server")
	fs.String(flagCoderSessionToken, "", "static coderd session token (prefer staticBackend.sessionTokenFile: flags show in process lists)")
	fs.String("coder-namespace", "", "Kubernetes namespace the static coderd's objects appear in")
	fs.Duration("coder-request-timeout", d.AggregatedAPIServer.Coder.RequestTimeout.Duration, "timeout of each call to coderd")
}
