// Package app is the composition root: the one place that knows every
// component and wires them to the configuration, to one another and to the
// process lifecycle for each application mode.
package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/coder/coder-k8s/internal/aggregated/admission"
	"github.com/coder/coder-k8s/internal/aggregated/apiserver"
	"github.com/coder/coder-k8s/internal/aggregated/autotls"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/controller"
	"github.com/coder/coder-k8s/internal/controller/controlplane"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/scheme"
)

// gracefulShutdown bounds how long runnables may take to stop after
// SIGTERM; it stays below the 30s default pod termination grace period.
const gracefulShutdown = 25 * time.Second

// Run runs the components cfg.App selects until ctx is cancelled.
func Run(ctx context.Context, cfg *config.Configuration, log logr.Logger) error {
	run, ok := modes[cfg.App]
	if !ok {
		return fmt.Errorf("unknown app mode %q: valid modes are %s", cfg.App, modeList())
	}
	kube, err := kubeConnection(cfg.Kubernetes)
	if err != nil {
		return err
	}
	return run(ctx, cfg, kube, log)
}

type runFunc func(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger) error

// modes maps each application mode onto what it runs.
var modes = map[config.AppMode]runFunc{
	config.AppAll: func(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger) error {
		return runManager(ctx, cfg, kube, log, true)
	},
	config.AppController: func(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger) error {
		return runManager(ctx, cfg, kube, log, false)
	},
	config.AppAggregatedAPIServer: runAggregatedAPIServer,
	config.AppMCPHTTP: func(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger) error {
		direct, cs, err := kube.clients()
		if err != nil {
			return err
		}
		o := mcpOptions(cfg.MCP)
		// No cache in this mode: every read asks kube-apiserver.
		o.Kube = mcpserver.Kube{Cached: direct, Direct: direct, Clientset: cs}
		o.REST = kube.rest
		o.Ready = apiReachable(kube.rest)
		o.Log = log
		srv, err := mcpserver.New(o)
		if err != nil {
			return err
		}
		g, gctx := errgroup.WithContext(ctx)
		if err := serveMetrics(gctx, g, cfg); err != nil {
			return err
		}
		g.Go(func() error { return srv.Start(gctx) })
		return g.Wait()
	},
}

// runManager runs one controller-runtime manager, with one cache, that
// hosts the reconcilers (leader only) and, in all mode, the aggregated API
// server and MCP server (every replica).
func runManager(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger, all bool) error {
	mgr, err := ctrl.NewManager(kube.rest, managerOptions(cfg, log))
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add health check: %w", err)
	}
	cacheSynced := cacheSyncedChecker(mgr)
	if err := mgr.AddReadyzCheck("cache", cacheSynced); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	// The aggregated API tells the controller, in this process, when
	// coderd rejects an operator token, so the token is replaced at once
	// rather than at the next access check. Sends never block: a full
	// buffer (a follower replica, whose controller does not run) drops
	// the request and the check comes at its interval.
	rechecks := make(chan event.TypedGenericEvent[types.NamespacedName], 64)
	if err := controller.Setup(mgr, controller.Options{
		CoderRequestTimeout:          cfg.Controller.CoderRequestTimeout.Duration,
		OperatorAccessCheckInterval:  cfg.Controller.OperatorAccessCheckInterval.Duration,
		ReplacedTokenRevocationDelay: cfg.Controller.ReplacedTokenRevocationDelay.Duration,
		AccessRechecks:               rechecks,
		WorkspaceRBAC:                workspaceRBACPolicy(cfg.Controller.WorkspaceRBAC),
	}); err != nil {
		return fmt.Errorf("set up controllers: %w", err)
	}
	if all {
		recheck := func(key types.NamespacedName) {
			select {
			case rechecks <- event.TypedGenericEvent[types.NamespacedName]{Object: key}:
			default:
			}
		}
		cps, err := backend.NewControlPlaneProvider(mgr, cfg.AggregatedAPIServer.Coder.RequestTimeout.Duration, recheck, log)
		if err != nil {
			return fmt.Errorf("control plane discovery: %w", err)
		}
		var backends backend.Provider = cps
		if sb := cfg.AggregatedAPIServer.Coder.StaticBackend; sb.Enabled() {
			static, err := staticBackend(cfg, kube, log)
			if err != nil {
				return err
			}
			if err := mgr.Add(static); err != nil {
				return fmt.Errorf("add static backend: %w", err)
			}
			backends = backend.Join(static, cps)
		}
		opts := apiServerOptions(cfg.AggregatedAPIServer, &admission.Options{REST: kube.rest, Cache: mgr.GetCache()})
		opts.Kubeconfig, opts.Backends, opts.Log = kube.file, backends, log
		opts.Records = records.New(mgr.GetCache(), mgr.GetClient())
		// Secrets, pods and events are read uncached through it
		// (kubecache.ClientOptions).
		opts.Kube = mgr.GetClient()
		rot, err := autoTLS(cfg, kube, log)
		if err != nil {
			return err
		}
		if rot != nil {
			// A non-leader runnable: every replica serves TLS.
			if err := mgr.Add(rot); err != nil {
				return fmt.Errorf("add autoTLS: %w", err)
			}
			opts.ServingCert = rot.ServingCert()
		}
		srv, err := apiserver.New(opts)
		if err != nil {
			return err
		}
		if err := mgr.Add(srv); err != nil {
			return fmt.Errorf("add aggregated API server: %w", err)
		}
		direct, cs, err := kube.clients()
		if err != nil {
			return err
		}
		mo := mcpOptions(cfg.MCP)
		// The cache serves the tools only with mcp.auth none; callers'
		// own clients read kube-apiserver directly.
		mo.Kube = mcpserver.Kube{Cached: mgr.GetClient(), Direct: direct, Clientset: cs}
		mo.REST = kube.rest
		mo.Ready = cacheSynced
		mo.Log = log
		mcpSrv, err := mcpserver.New(mo)
		if err != nil {
			return err
		}
		if err := mgr.Add(mcpSrv); err != nil {
			return fmt.Errorf("add MCP server: %w", err)
		}
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	return nil
}

// managerOptions are the options of the manager of runManager.
func managerOptions(cfg *config.Configuration, log logr.Logger) ctrl.Options {
	le := cfg.Controller.LeaderElection
	return ctrl.Options{
		Scheme:                        scheme.New(),
		Logger:                        log,
		Metrics:                       metricsserver.Options{BindAddress: cfg.Controller.MetricsBindAddress},
		HealthProbeBindAddress:        cfg.Controller.HealthProbeBindAddress,
		LeaderElection:                le.Enabled,
		LeaderElectionID:              le.LeaseName,
		LeaderElectionNamespace:       le.Namespace,
		LeaderElectionResourceLock:    resourcelock.LeasesResourceLock,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &le.LeaseDuration.Duration,
		RenewDeadline:                 &le.RenewDeadline.Duration,
		RetryPeriod:                   &le.RetryPeriod.Duration,
		GracefulShutdownTimeout:       ptr(gracefulShutdown),
		// Only what coder-k8s owns is cached, and Secrets are read
		// uncached (see package kubecache).
		Cache:  kubecache.Options(),
		Client: kubecache.ClientOptions(),
	}
}

// runAggregatedAPIServer serves the aggregated API alone, backed by the
// static backend from the configuration.
func runAggregatedAPIServer(ctx context.Context, cfg *config.Configuration, kube *kubeConn, log logr.Logger) error {
	static, err := staticBackend(cfg, kube, log)
	if err != nil {
		return err
	}
	// The records' informer: this mode has no manager, so it has a cache
	// of its own, set up as the manager's.
	co := kubecache.Options()
	co.Scheme = scheme.New()
	// The static backend's objects, and so their records, are all in one
	// namespace: watch only that one (the chart grants a Role there).
	co.DefaultNamespaces = map[string]cache.Config{cfg.AggregatedAPIServer.Coder.StaticBackend.Namespace: {}}
	recordCache, err := cache.New(kube.rest, co)
	if err != nil {
		return fmt.Errorf("records cache: %w", err)
	}
	direct, _, err := kube.clients()
	if err != nil {
		return err
	}
	// Cluster-scoped, the admission configuration is cached whole
	// whatever the cache's namespaces.
	opts := apiServerOptions(cfg.AggregatedAPIServer, &admission.Options{REST: kube.rest, Cache: recordCache})
	opts.Kubeconfig, opts.Backends, opts.Log = kube.file, static, log
	opts.Records = records.New(recordCache, direct)
	opts.Kube = direct
	rot, err := autoTLS(cfg, kube, log)
	if err != nil {
		return err
	}
	if rot != nil {
		opts.ServingCert = rot.ServingCert()
	}
	srv, err := apiserver.New(opts)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	if err := serveMetrics(gctx, g, cfg); err != nil {
		return err
	}
	g.Go(func() error { return static.Start(gctx) })
	g.Go(func() error { return recordCache.Start(gctx) })
	if rot != nil {
		g.Go(func() error { return rot.Start(gctx) })
	}
	g.Go(func() error { return srv.Start(gctx) })
	return g.Wait()
}

// serveMetrics serves /metrics at controller.metricsBindAddress in g, for
// the modes without a manager (which serves it itself): the same registry,
// controller-runtime's, which holds every coder-k8s metric. "0" turns it
// off.
func serveMetrics(ctx context.Context, g *errgroup.Group, cfg *config.Configuration) error {
	srv, err := metricsserver.NewServer(metricsserver.Options{BindAddress: cfg.Controller.MetricsBindAddress}, nil, nil)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	if srv != nil {
		g.Go(func() error { return srv.Start(ctx) })
	}
	return nil
}

// autoTLS returns the serving certificate manager of
// aggregatedAPIServer.autoTLS, or nil when it is off.
func autoTLS(cfg *config.Configuration, kube *kubeConn, log logr.Logger) (*autotls.Rotator, error) {
	if !cfg.AggregatedAPIServer.AutoTLS.Enabled {
		return nil, nil
	}
	c := cfg.AggregatedAPIServer.AutoTLS
	rot, err := autotls.New(autotls.Options{
		SecretName:     c.SecretName,
		Namespace:      c.Namespace,
		ServiceName:    c.ServiceName,
		APIServiceName: c.APIServiceName,
		CertValidity:   c.CertValidity.Duration,
		REST:           kube.rest,
		Log:            log,
	})
	if err != nil {
		return nil, fmt.Errorf("aggregatedAPIServer.autoTLS: %w", err)
	}
	return rot, nil
}

func staticBackend(cfg *config.Configuration, kube *kubeConn, log logr.Logger) (*backend.StaticProvider, error) {
	cs, err := kubernetes.NewForConfig(kube.rest)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	p, err := backend.NewStaticProvider(staticOptions(cfg.AggregatedAPIServer.Coder), cs, log)
	if err != nil {
		return nil, fmt.Errorf("aggregatedAPIServer.coder.staticBackend: %w", err)
	}
	return p, nil
}

// apiServerOptions are the aggregated API server's options from
// aggregatedAPIServer; adm is its admission chain's Kubernetes access,
// used only when aggregatedAPIServer.admission is enabled. The caller
// adds the rest: Kubeconfig, Backends, Records, ServingCert and Log.
func apiServerOptions(c config.AggregatedAPIServer, adm *admission.Options) apiserver.Options {
	o := apiserver.Options{
		BindAddress:       c.BindAddress,
		SecurePort:        c.SecurePort,
		CertDir:           c.CertDir,
		RequestTimeout:    c.RequestTimeout.Duration,
		WatchPollInterval: c.WatchPollInterval.Duration,
		BuildWait: templatesource.WaitConfig{
			Timeout:             c.TemplateBuildWait.Timeout.Duration,
			BackoffAfter:        c.TemplateBuildWait.BackoffAfter.Duration,
			InitialPollInterval: c.TemplateBuildWait.InitialPollInterval.Duration,
			MaxPollInterval:     c.TemplateBuildWait.MaxPollInterval.Duration,
		},
		Identity: identity.Options{ClusterControllers: c.Identity.ClusterControllers},
	}
	if c.Admission.Enabled {
		o.Admission = adm
	}
	return o
}

// staticOptions are the static backend's options from
// aggregatedAPIServer.coder.
func staticOptions(c config.Coder) backend.StaticOptions {
	sb := c.StaticBackend
	mappings := make([]identity.Mapping, len(sb.Identity.Mappings))
	for i, m := range sb.Identity.Mappings {
		mappings[i] = identity.Mapping{KubernetesUser: m.KubernetesUser, CoderUser: m.CoderUser}
	}
	return backend.StaticOptions{
		URL:              sb.URL,
		SessionToken:     sb.SessionToken,
		SessionTokenFile: sb.SessionTokenFile,
		Namespace:        sb.Namespace,
		Identity: identity.Rules{
			Mode:           identity.Mode(sb.Identity.Mode),
			UsernamePrefix: sb.Identity.UsernamePrefix,
			MatchField:     identity.MatchField(sb.Identity.MatchBy),
			Mappings:       mappings,
		},
		CoderTimeout: c.RequestTimeout.Duration,
	}
}

// mcpOptions are the MCP server's options from mcp. The caller adds the
// rest: Kube, REST, Ready and Log.
func mcpOptions(c config.MCP) mcpserver.Options {
	return mcpserver.Options{
		BindAddress: c.BindAddress,
		AuthNone:    c.Auth == config.MCPAuthNone,
		Audiences:   c.Audiences,
		OAuth: mcpserver.OAuth{
			Resource:             c.OAuth.Resource,
			AuthorizationServers: c.OAuth.AuthorizationServers,
			Scopes:               c.OAuth.Scopes,
		},
		ReadOnly:              c.ReadOnly,
		AllowDestructiveTools: c.AllowDestructiveTools,
		AllowTools:            c.AllowTools,
		DenyTools:             c.DenyTools,
		MaxRequestBytes:       c.MaxRequestBytes,
		ReadHeaderTimeout:     c.ReadHeaderTimeout.Duration,
		ToolTimeout:           c.ToolTimeout.Duration,
	}
}

// cacheSyncedChecker is ready once the shared cache has synced.
func cacheSyncedChecker(mgr manager.Manager) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("caches have not synced")
		}
		return nil
	}
}

// apiReachable is ready while the Kubernetes API answers discovery.
func apiReachable(cfg *rest.Config) healthz.Checker {
	return func(*http.Request) error {
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return err
		}
		if _, err := dc.ServerVersion(); err != nil {
			return fmt.Errorf("kubernetes API unreachable: %w", err)
		}
		return nil
	}
}

// kubeConn is how the process reaches the Kubernetes API: the client
// config, and the kubeconfig file it came from (empty in-cluster), which
// the aggregated API server's delegated authentication reads itself.
type kubeConn struct {
	rest *rest.Config
	file string
}

// clients returns an uncached client (its scheme knows the aggregated
// types) and a clientset.
func (k *kubeConn) clients() (client.Client, kubernetes.Interface, error) {
	rc := rest.CopyConfig(k.rest)
	// These clients read lists of hundreds of KiB (the MCP tools' lists of
	// aggregated objects) from kube-apiserver in the same cluster, where
	// gzip costs more CPU on both ends than it saves in transfer.
	rc.DisableCompression = true
	direct, err := client.New(rc, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return direct, cs, nil
}

func kubeConnection(k config.Kubernetes) (*kubeConn, error) {
	file := k.Kubeconfig
	if file == "" {
		// Like kubectl: the first existing $KUBECONFIG entry.
		for _, p := range filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar)) {
			if _, err := os.Stat(p); err == nil {
				file = p
				break
			}
		}
	}
	var rc *rest.Config
	var err error
	if file != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", file)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (kubernetes.kubeconfig %q): %w", file, err)
	}
	rc.QPS = k.QPS
	rc.Burst = k.Burst
	rc.UserAgent = "coder-k8s"
	return &kubeConn{rest: rc, file: file}, nil
}

func modeList() string {
	s := make([]string, len(config.AppModes))
	for i, m := range config.AppModes {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}

func ptr[T any](v T) *T { return &v }

// workspaceRBACPolicy is the controller's view of
// controller.workspaceRBAC.
func workspaceRBACPolicy(c config.WorkspaceRBAC) *controlplane.WorkspaceRBACPolicy {
	p := &controlplane.WorkspaceRBACPolicy{
		ClusterRole:            c.ClusterRole,
		DeploymentsClusterRole: c.DeploymentsClusterRole,
		AllowedClusterRoles:    c.AllowedClusterRoles,
		ExtraNamespaces:        map[string][]string{},
	}
	for _, g := range c.ExtraNamespaces {
		p.ExtraNamespaces[g.ControlPlaneNamespace] = g.Namespaces
	}
	return p
}
