package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/defaults.golden.yaml from Default()")

const golden = "testdata/defaults.golden.yaml"

// The golden file makes every change to a default visible in review.
func TestDefaultsGolden(t *testing.T) {
	got, err := yaml.Marshal(Default())
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s (run `make generate`): %v", golden, err)
	}
	if string(got) != string(want) {
		t.Errorf("defaults differ from %s; if the change is intended run `make generate`\n--- got\n%s\n--- want\n%s", golden, got, want)
	}
}

func TestDefaultsAreValid(t *testing.T) {
	cfg := Default()
	if errs := Validate(&cfg); len(errs) > 0 {
		t.Fatalf("defaults are invalid: %v", errs.ToAggregate())
	}
	// The golden file is itself a valid configuration file.
	got, err := Load(Source{File: golden, Environ: []string{}})
	if err != nil {
		t.Fatalf("load golden file: %v", err)
	}
	if got.AggregatedAPIServer.TemplateBuildWait.Timeout.Duration != 25*time.Minute {
		t.Errorf("build wait timeout = %s, want 25m", got.AggregatedAPIServer.TemplateBuildWait.Timeout)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const envelope = "apiVersion: config.coder.com/v1alpha1\nkind: CoderK8sConfiguration\n"

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

func TestNoFileMeansDefaults(t *testing.T) {
	cfg, err := Load(Source{Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.App != AppAll || cfg.MCP.BindAddress != ":8090" || cfg.AggregatedAPIServer.SecurePort != 6443 {
		t.Errorf("unexpected defaults: app=%s mcp=%s port=%d", cfg.App, cfg.MCP.BindAddress, cfg.AggregatedAPIServer.SecurePort)
	}
}

// defaults < file < environment < explicitly set flags.
func TestPrecedence(t *testing.T) {
	file := writeFile(t, envelope+`
app: controller
logging:
  level: debug
aggregatedAPIServer:
  templateBuildWait:
    timeout: 10m
    backoffAfter: 1m
  coder:
    requestTimeout: 20s
`)
	env := []string{
		"CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT=12m",
		"UNRELATED=1",
	}

	t.Run("file over defaults", func(t *testing.T) {
		cfg, err := Load(Source{File: file, Environ: []string{}})
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, "app", cfg.App, AppController)
		assertEqual(t, "logging.level", cfg.Logging.Level, "debug")
		assertEqual(t, "timeout", cfg.AggregatedAPIServer.TemplateBuildWait.Timeout.Duration, 10*time.Minute)
		// Keys the file does not set keep their defaults.
		assertEqual(t, "logging.format", cfg.Logging.Format, "json")
		assertEqual(t, "maxPollInterval", cfg.AggregatedAPIServer.TemplateBuildWait.MaxPollInterval.Duration, 10*time.Second)
	})
	t.Run("environment over file", func(t *testing.T) {
		cfg, err := Load(Source{File: file, Environ: env})
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, "timeout", cfg.AggregatedAPIServer.TemplateBuildWait.Timeout.Duration, 12*time.Minute)
		assertEqual(t, "backoffAfter", cfg.AggregatedAPIServer.TemplateBuildWait.BackoffAfter.Duration, time.Minute)
	})
	t.Run("explicit flags over environment and file", func(t *testing.T) {
		cfg, err := Load(Source{File: file, Environ: env, Flags: flags(t, "--app=all", "--coder-request-timeout=5s")})
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, "app", cfg.App, AppAll)
		assertEqual(t, "coder.requestTimeout", cfg.AggregatedAPIServer.Coder.RequestTimeout.Duration, 5*time.Second)
	})
	t.Run("flags left at their defaults do not override the file", func(t *testing.T) {
		cfg, err := Load(Source{File: file, Environ: []string{}, Flags: flags(t)})
		if err != nil {
			t.Fatal(err)
		}
		assertEqual(t, "app", cfg.App, AppController)
		assertEqual(t, "logging.level", cfg.Logging.Level, "debug")
		assertEqual(t, "coder.requestTimeout", cfg.AggregatedAPIServer.Coder.RequestTimeout.Duration, 20*time.Second)
	})
}

// The environment variables of the original design notes keep working.
func TestDesignNotesEnvironment(t *testing.T) {
	cfg, err := Load(Source{Environ: []string{
		"CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT=20m",
		"CODER_K8S_TEMPLATE_BUILD_BACKOFF_AFTER=90s",
		"CODER_K8S_TEMPLATE_BUILD_INITIAL_POLL_INTERVAL=1s",
		"CODER_K8S_TEMPLATE_BUILD_MAX_POLL_INTERVAL=30s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.AggregatedAPIServer.TemplateBuildWait
	assertEqual(t, "timeout", w.Timeout.Duration, 20*time.Minute)
	assertEqual(t, "backoffAfter", w.BackoffAfter.Duration, 90*time.Second)
	assertEqual(t, "initialPollInterval", w.InitialPollInterval.Duration, time.Second)
	assertEqual(t, "maxPollInterval", w.MaxPollInterval.Duration, 30*time.Second)
}

// The flags of the original design notes keep working.
func TestDesignNotesFlags(t *testing.T) {
	cfg, err := Load(Source{Environ: []string{}, Flags: flags(t,
		"--app=aggregated-apiserver",
		"--coder-url=https://coder.example.com",
		"--coder-session-token=s3cret",
		"--coder-namespace=coder-system",
		"--coder-request-timeout=45s",
		"--kubeconfig=/etc/kube/config",
	)})
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.AggregatedAPIServer.Coder.StaticBackend
	assertEqual(t, "app", cfg.App, AppAggregatedAPIServer)
	assertEqual(t, "url", s.URL, "https://coder.example.com")
	assertEqual(t, "token", s.SessionToken, "s3cret")
	assertEqual(t, "namespace", s.Namespace, "coder-system")
	assertEqual(t, "requestTimeout", cfg.AggregatedAPIServer.Coder.RequestTimeout.Duration, 45*time.Second)
	assertEqual(t, "kubeconfig", cfg.Kubernetes.Kubeconfig, "/etc/kube/config")

	// The token never appears when the configuration is written out.
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "s3cret") {
		t.Errorf("session token leaked into the rendered configuration:\n%s", out)
	}
}

func TestRejects(t *testing.T) {
	tests := []struct {
		name  string
		file  string
		env   []string
		flags []string
		want  []string
	}{{
		name: "misspelled key",
		file: envelope + "aggregatedAPIServer:\n  templateBuildWait:\n    timout: 5m\n",
		want: []string{"aggregatedAPIServer.templateBuildWait.timout: unknown field"},
	}, {
		name: "zero build wait from the environment",
		file: envelope,
		env:  []string{"CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT=0s"},
		want: []string{"aggregatedAPIServer.templateBuildWait.timeout", "set by environment variable CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT"},
	}, {
		name: "unknown apiVersion",
		file: "apiVersion: config.coder.com/v2\nkind: CoderK8sConfiguration\n",
		want: []string{"apiVersion: Unsupported value: config.coder.com/v2"},
	}, {
		name: "unknown kind",
		file: "apiVersion: config.coder.com/v1alpha1\nkind: Deployment\n",
		want: []string{"kind: Unsupported value: Deployment"},
	}, {
		name: "missing envelope",
		file: "app: all\n",
		want: []string{"apiVersion: Required value", "kind: Required value"},
	}, {
		name: "unknown mode",
		file: envelope + "app: everything\n",
		want: []string{`app: Unsupported value: "everything"`},
	}, {
		name:  "unknown mode from a flag",
		file:  envelope,
		flags: []string{"--app=everything"},
		want:  []string{`app: Unsupported value: "everything"`, "set by flag --app"},
	}, {
		name: "wrong types, every one reported",
		file: envelope + "kubernetes:\n  qps: fast\ncontroller:\n  leaderElection:\n    enabled: \"yes\"\naggregatedAPIServer:\n  securePort: \"6443\"\n  requestTimeout: 30\n",
		want: []string{
			`kubernetes.qps: Invalid value: "fast": must be a number`,
			`controller.leaderElection.enabled: Invalid value: "yes": must be true or false`,
			`aggregatedAPIServer.securePort: Invalid value: "6443": must be an integer`,
			`aggregatedAPIServer.requestTimeout: Invalid value: 30: must be a duration`,
		},
	}, {
		name: "case matters",
		file: envelope + "App: all\n",
		want: []string{"App: unknown field"},
	}, {
		name: "every validation problem at once",
		file: envelope + `
logging: {level: loud, format: xml}
controller:
  healthProbeBindAddress: "8081"
  leaderElection: {leaseDuration: 5s, renewDeadline: 10s}
aggregatedAPIServer:
  bindAddress: everywhere
  securePort: 70000
mcp: {bindAddress: nowhere}
`,
		want: []string{
			"logging.level: Unsupported value", "logging.format: Unsupported value",
			"controller.healthProbeBindAddress: Invalid value", "controller.leaderElection.renewDeadline: Invalid value",
			"aggregatedAPIServer.bindAddress: Invalid value", "aggregatedAPIServer.securePort: Invalid value",
			"mcp.bindAddress: Invalid value",
		},
	}, {
		name: "standalone aggregated API server needs a static backend",
		file: envelope + "app: aggregated-apiserver\n",
		want: []string{"aggregatedAPIServer.coder.staticBackend.url: Required value"},
	}, {
		name: "static backend needs a token and a namespace",
		file: envelope + "aggregatedAPIServer:\n  coder:\n    staticBackend:\n      url: https://coder.example.com\n",
		want: []string{"staticBackend.namespace: Required value", "staticBackend.sessionTokenFile: Required value"},
	}, {
		name: "static backend URL must be absolute",
		file: envelope + "aggregatedAPIServer:\n  coder:\n    staticBackend: {url: coder.example.com, namespace: coder, sessionTokenFile: /t}\n",
		want: []string{"staticBackend.url: Invalid value"},
	}, {
		name: "workspace RBAC policy, every problem with its path",
		file: envelope + `
controller:
  workspaceRBAC:
    clusterRole: "a/b"
    allowedClusterRoles: [""]
    extraNamespaces:
      - {controlPlaneNamespace: tenant-a, namespaces: [Kube_System]}
      - {controlPlaneNamespace: tenant-a, namespaces: []}
`,
		want: []string{
			`controller.workspaceRBAC.clusterRole: Invalid value: "a/b"`,
			"controller.workspaceRBAC.allowedClusterRoles[0]: Required value",
			`controller.workspaceRBAC.extraNamespaces[0].namespaces[0]: Invalid value: "Kube_System"`,
			`controller.workspaceRBAC.extraNamespaces[1].controlPlaneNamespace: Duplicate value: "tenant-a"`,
			"controller.workspaceRBAC.extraNamespaces[1].namespaces: Required value",
		},
	}, {
		name: "workspace RBAC namespace grants are objects with known keys",
		file: envelope + "controller:\n  workspaceRBAC:\n    extraNamespaces:\n      - {controlPlaneNamespace: a, namespace: [b]}\n",
		want: []string{"controller.workspaceRBAC.extraNamespaces: Invalid value", "must be a list of objects with the keys controlPlaneNamespace, namespaces"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env
			if env == nil {
				env = []string{}
			}
			_, err := Load(Source{File: writeFile(t, tc.file), Environ: env, Flags: flags(t, tc.flags...)})
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestWorkspaceRBACPolicy(t *testing.T) {
	cfg, err := Load(Source{File: writeFile(t, envelope+`
controller:
  workspaceRBAC:
    clusterRole: ws
    deploymentsClusterRole: ws-deploy
    allowedClusterRoles: [ws, extra]
    extraNamespaces:
      - controlPlaneNamespace: tenant-a
        namespaces: [tenant-a-ws]
`), Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	w := cfg.Controller.WorkspaceRBAC
	if w.ClusterRole != "ws" || w.DeploymentsClusterRole != "ws-deploy" || strings.Join(w.AllowedClusterRoles, ",") != "ws,extra" {
		t.Errorf("workspaceRBAC = %+v", w)
	}
	if len(w.ExtraNamespaces) != 1 || w.ExtraNamespaces[0].ControlPlaneNamespace != "tenant-a" || strings.Join(w.ExtraNamespaces[0].Namespaces, ",") != "tenant-a-ws" {
		t.Errorf("extraNamespaces = %+v", w.ExtraNamespaces)
	}
	// Default: the chart's ClusterRoles for release coder-k8s, and no
	// namespace besides a control plane's own.
	d := Default().Controller.WorkspaceRBAC
	if d.ClusterRole != "coder-k8s-workspace" || d.DeploymentsClusterRole != "coder-k8s-workspace-deployments" || len(d.ExtraNamespaces) != 0 || len(d.AllowedClusterRoles) != 0 {
		t.Errorf("default workspaceRBAC = %+v", d)
	}
}

// The cluster's controllers act with the operator's session by default; a
// file lists others, or none with an empty list (or null), which does
// not fall back to the defaults.
func TestClusterControllers(t *testing.T) {
	gc := "system:serviceaccount:kube-system:generic-garbage-collector"
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"not set", envelope, []string{gc, "system:serviceaccount:kube-system:namespace-controller", "system:kube-controller-manager"}},
		{"other names", envelope + "aggregatedAPIServer:\n  identity:\n    clusterControllers: [" + gc + ", my-gc]\n", []string{gc, "my-gc"}},
		{"empty list", envelope + "aggregatedAPIServer:\n  identity:\n    clusterControllers: []\n", nil},
		{"null", envelope + "aggregatedAPIServer:\n  identity:\n    clusterControllers: null\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(Source{File: writeFile(t, tc.file), Environ: []string{}})
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.AggregatedAPIServer.Identity.ClusterControllers; !slices.Equal(got, tc.want) {
				t.Errorf("clusterControllers = %q, want %q", got, tc.want)
			}
		})
	}

	_, err := Load(Source{File: writeFile(t, envelope+`
aggregatedAPIServer:
  identity:
    clusterControllers: ["", " padded", system:anonymous, my-gc, my-gc]
`), Environ: []string{}})
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("Load: %v, want the problems listed", err)
	}
	want := []string{
		"aggregatedAPIServer.identity.clusterControllers[0]: Required value: a Kubernetes username",
		`aggregatedAPIServer.identity.clusterControllers[1]: Invalid value: " padded": must not start or end with whitespace: usernames are matched exactly`,
		"aggregatedAPIServer.identity.clusterControllers[2]: Forbidden: unauthenticated requests never act with the operator's Coder session",
		`aggregatedAPIServer.identity.clusterControllers[4]: Duplicate value: "my-gc"`,
	}
	if !slices.Equal(cerr.Problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(cerr.Problems, "\n"), strings.Join(want, "\n"))
	}
	_, err = Load(Source{File: writeFile(t, envelope+"aggregatedAPIServer:\n  identity:\n    clusterControllers: system:kube-controller-manager\n"), Environ: []string{}})
	if err == nil || !strings.Contains(err.Error(), `aggregatedAPIServer.identity.clusterControllers: Invalid value: "system:kube-controller-manager": must be a list of strings`) {
		t.Errorf("a string for the list: %v", err)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := Load(Source{File: filepath.Join(t.TempDir(), "absent.yaml"), Environ: []string{}})
	if err == nil || !strings.Contains(err.Error(), "absent.yaml") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}

// Every environment variable and flag must target a real key, or it would
// be silently ignored.
func TestOverridesTargetRealKeys(t *testing.T) {
	for name, key := range EnvKeys {
		if _, ok := fieldTypes[key]; !ok {
			t.Errorf("environment variable %s maps to unknown key %s", name, key)
		}
	}
	for name, key := range flagKeys {
		if _, ok := fieldTypes[key]; !ok {
			t.Errorf("flag --%s maps to unknown key %s", name, key)
		}
	}
}

func assertEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// mcp.auth none serves every caller with coder-k8s's own permissions, so
// it must only listen where nothing but this machine can connect.
func TestMCPAuthNoneOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:8090", "127.3.4.5:0", "[::1]:8090", "localhost:8090", "LocalHost:8090"} {
		cfg, err := Load(Source{File: writeFile(t, envelope+"mcp: {auth: none, bindAddress: \""+addr+"\"}\n"), Environ: []string{}})
		if err != nil {
			t.Errorf("auth none on %s: %v", addr, err)
			continue
		}
		assertEqual(t, "mcp.auth", cfg.MCP.Auth, MCPAuthNone)
	}
	for _, addr := range []string{"", ":8090", "0.0.0.0:8090", "[::]:8090", "10.0.0.7:8090", "[::ffff:10.0.0.7]:8090", "coder-k8s.example.com:8090", "127.0.0.1.example.com:8090", "localhost.example.com:8090"} {
		_, err := Load(Source{File: writeFile(t, envelope+"mcp: {auth: none, bindAddress: \""+addr+"\"}\n"), Environ: []string{}})
		want := `mcp.auth: Invalid value: "none": allowed only when mcp.bindAddress is a loopback address (127.0.0.0/8, ::1 or localhost), and it is "` + addr + `"`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("auth none on %s: %v, want an error saying %q", addr, err, want)
		}
	}
	// The default bind address listens everywhere.
	if _, err := Load(Source{File: writeFile(t, envelope+"mcp: {auth: none}\n"), Environ: []string{}}); err == nil || !strings.Contains(err.Error(), `and it is ":8090"`) {
		t.Errorf("auth none on the default address: %v, want refused", err)
	}
	// Kubernetes authentication may listen anywhere.
	if _, err := Load(Source{File: writeFile(t, envelope+"mcp: {auth: kubernetes, bindAddress: \":8090\"}\n"), Environ: []string{}}); err != nil {
		t.Errorf("auth kubernetes on all interfaces: %v", err)
	}
}

// mcp.audiences and mcp.oauth: the metadata's URLs are checked where
// they are written, with their field paths.
func TestMCPOAuthValidation(t *testing.T) {
	good := envelope + `mcp:
  audiences: [coder-k8s-mcp]
  oauth:
    resource: https://mcp.example.com/mcp
    authorizationServers: [https://issuer.example.com, https://login.example.com/realms/k8s]
    scopes: [openid, groups]
`
	cfg, err := Load(Source{File: writeFile(t, good), Environ: []string{}})
	if err != nil {
		t.Fatalf("valid OAuth settings: %v", err)
	}
	if !slices.Equal(cfg.MCP.Audiences, []string{"coder-k8s-mcp"}) || cfg.MCP.OAuth.Resource != "https://mcp.example.com/mcp" ||
		len(cfg.MCP.OAuth.AuthorizationServers) != 2 || !slices.Equal(cfg.MCP.OAuth.Scopes, []string{"openid", "groups"}) {
		t.Errorf("loaded: %+v", cfg.MCP)
	}
	// http is fine on loopback, as clients reach a port-forward.
	if _, err := Load(Source{File: writeFile(t, envelope+"mcp: {oauth: {resource: \"http://localhost:8090/mcp\"}}\n"), Environ: []string{}}); err != nil {
		t.Errorf("http resource on localhost: %v", err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{`{audiences: [""]}`, `mcp.audiences[0]: Invalid value: "": must not be empty`},
		{`{oauth: {resource: "mcp.example.com/mcp"}}`, `mcp.oauth.resource: Invalid value: "mcp.example.com/mcp": must be an absolute URL such as https://mcp.example.com/mcp`},
		{`{oauth: {resource: "http://mcp.example.com/mcp"}}`, `mcp.oauth.resource: Invalid value: "http://mcp.example.com/mcp": must use https (http only on a loopback host)`},
		{`{oauth: {resource: "https://mcp.example.com/mcp#x"}}`, `mcp.oauth.resource: Invalid value: "https://mcp.example.com/mcp#x": must not have a query or fragment`},
		{`{oauth: {authorizationServers: ["http://issuer.example.com"]}}`, `mcp.oauth.authorizationServers[0]: Invalid value: "http://issuer.example.com": must be an issuer URL: https, with no query or fragment, such as https://issuer.example.com`},
		{`{oauth: {authorizationServers: ["https://issuer.example.com", "https://issuer.example.com?x=1"]}}`, `mcp.oauth.authorizationServers[1]: Invalid value: "https://issuer.example.com?x=1": must be an issuer URL`},
		{`{oauth: {scopes: ["open id"]}}`, `mcp.oauth.scopes[0]: Invalid value: "open id": must be a scope token: not empty, no spaces or quotes`},
	} {
		_, err := Load(Source{File: writeFile(t, envelope+"mcp: "+tc.yaml+"\n"), Environ: []string{}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("mcp: %s: %v, want an error saying %q", tc.yaml, err, tc.want)
		}
	}
}

// An old file setting templateBuildWait.timeout (once a request's wait,
// now the background build's limit) still loads, above requestTimeout too,
// and says that the key's meaning changed; so does the environment.
func TestChangedKeyWarning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	file := "apiVersion: config.coder.com/v1alpha1\nkind: CoderK8sConfiguration\naggregatedAPIServer:\n  templateBuildWait:\n    timeout: 45m\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(Source{File: path, Environ: []string{}})
	if err != nil {
		t.Fatalf("an old file no longer loads: %v", err)
	}
	assertEqual(t, "timeout", cfg.AggregatedAPIServer.TemplateBuildWait.Timeout.Duration, 45*time.Minute)
	if len(cfg.Warnings) != 1 || !strings.HasPrefix(cfg.Warnings[0], "deprecated: aggregatedAPIServer.templateBuildWait.timeout (set in "+path+"): requests no longer wait for template builds") {
		t.Errorf("warnings = %q", cfg.Warnings)
	}

	cfg, err = Load(Source{Environ: []string{"CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT=10m"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "(set by environment variable CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT)") {
		t.Errorf("warnings = %q", cfg.Warnings)
	}
	cfg, err = Load(Source{Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 0 {
		t.Errorf("the defaults give warnings: %q", cfg.Warnings)
	}
}
