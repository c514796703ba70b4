// Package apiserver is the aggregated API server for aggregation.coder.com:
// a k8s.io/apiserver GenericAPIServer with delegated authentication and
// authorization, served behind kube-apiserver's aggregation layer.
package apiserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/component-base/compatibility"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/admission"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/storage"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/version"
)

// healthPaths answer without credentials so kubelet probes work; every
// other path requires an authenticated, authorized caller.
var healthPaths = []string{"/healthz", "/readyz", "/livez"}

// watchTerminationGracePeriod bounds how long shutdown waits for the
// watches it ends to close, well inside the process's graceful shutdown.
const watchTerminationGracePeriod = 5 * time.Second

// Server runs the aggregated API server as a manager runnable.
type Server struct {
	bindAddress    string
	securePort     int
	certDir        string
	requestTimeout time.Duration
	kubeconfig     string
	backends       backend.Provider
	cert           ServingCert
	log            logr.Logger

	scheme     *runtime.Scheme
	codecs     serializer.CodecFactory
	workspaces *storage.WorkspaceStorage
	templates  *storage.TemplateStorage
	versions   *storage.TemplateVersionStorage
	users      *storage.UserStorage
	groups     *storage.GroupStorage
	orgs       *storage.OrganizationStorage
	records    *records.Store
	identity   *identity.Service
	admission  *admission.Options
}

// Options are what the server is built from.
type Options struct {
	// BindAddress is the IP the secure port listens on.
	BindAddress string
	// SecurePort is the HTTPS port kube-apiserver's aggregation layer
	// connects to.
	SecurePort int
	// CertDir holds tls.crt and tls.key (a mounted kubernetes.io/tls
	// Secret). Empty, or a directory without them, means a self-signed
	// certificate generated at start. Ignored with ServingCert.
	CertDir string
	// RequestTimeout bounds every request; watches may stay open as long.
	RequestTimeout time.Duration
	// WatchPollInterval is how often the shared pollers list from coderd
	// to turn changes made anywhere into watch events.
	WatchPollInterval time.Duration
	// BuildWait tunes the background wait for the template versions that
	// CoderTemplate creates and updates upload.
	BuildWait templatesource.WaitConfig
	// Identity configures the callers that act with the operator's Coder
	// session in identity mode Mapped.
	Identity identity.Options
	// Kubeconfig is the file the delegated authentication and
	// authorization clients use; empty means in-cluster.
	Kubeconfig string
	// Backends finds the coderd of each namespace.
	Backends backend.Provider
	// Records keeps the objects' Kubernetes metadata; Start starts it
	// (its informer) before serving.
	Records *records.Store
	// ServingCert, when set, is the serving certificate (autoTLS): CertDir
	// is ignored, and Start waits until it has a certificate.
	ServingCert ServingCert
	// Kube reads the Secrets that templates' variables take values from
	// and the pods and events of workspaces (uncached), and creates the
	// SubjectAccessReviews that say whether the caller may; nil: no
	// variable can come from a Secret and no pod is looked at.
	Kube client.Client
	// Admission, when set, runs the cluster's admission chain on writes,
	// reading the cluster's configuration through it; nil runs none.
	Admission *admission.Options
	Log       logr.Logger
}

// ServingCert is a serving certificate that may change while the server
// runs; the TLS configuration reloads when its listeners are told.
type ServingCert interface {
	dynamiccertificates.CertKeyContentProvider
	// WaitForContent returns once there is a certificate, or ctx's error.
	WaitForContent(ctx context.Context) error
}

// New returns a server for o.
func New(o Options) (*Server, error) {
	scheme := runtime.NewScheme()
	if err := aggv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register %s: %w", aggv1.GroupName, err)
	}
	// The hub version the API machinery converts through. The served types
	// are the internal types too: with one version there is nothing to
	// convert, and the scheme maps between the two kinds without copying.
	scheme.AddKnownTypes(schema.GroupVersion{Group: aggv1.GroupName, Version: runtime.APIVersionInternal},
		&aggv1.CoderWorkspace{}, &aggv1.CoderWorkspaceList{}, &aggv1.CoderTemplate{}, &aggv1.CoderTemplateList{},
		&aggv1.CoderTemplateVersion{}, &aggv1.CoderTemplateVersionList{}, &aggv1.CoderUser{}, &aggv1.CoderUserList{},
		&aggv1.CoderGroup{}, &aggv1.CoderGroupList{},
		&aggv1.CoderOrganization{}, &aggv1.CoderOrganizationList{}, &aggv1.CoderLogOptions{})
	// The meta types every API server serves (Status, discovery documents,
	// list and watch options) regardless of its own groups.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{},
		&metav1.APIGroup{}, &metav1.APIResourceList{})
	log := o.Log.WithName("aggregated-apiserver")
	if o.Records == nil {
		return nil, fmt.Errorf("no records store given")
	}
	ident := identity.New(log, o.Identity)
	so := storage.Options{Backends: o.Backends, Records: o.Records, PollInterval: o.WatchPollInterval, Log: log, Identity: ident, Kube: kubeOrNil(o.Kube)}
	workspaces, err := storage.NewWorkspaces(so)
	if err != nil {
		return nil, fmt.Errorf("coderworkspaces storage: %w", err)
	}
	templates, err := storage.NewTemplates(so, storage.TemplateOptions{
		BuildWait: o.BuildWait,
		Limits:    templatesource.DefaultLimits,
		Kube:      kubeOrNil(o.Kube),
	})
	if err != nil {
		return nil, fmt.Errorf("codertemplates storage: %w", err)
	}
	versions, err := storage.NewTemplateVersions(so, templates)
	if err != nil {
		return nil, fmt.Errorf("codertemplateversions storage: %w", err)
	}
	users, err := storage.NewUsers(so, templates)
	if err != nil {
		return nil, fmt.Errorf("coderusers storage: %w", err)
	}
	groups, err := storage.NewGroups(so)
	if err != nil {
		return nil, fmt.Errorf("codergroups storage: %w", err)
	}
	orgs, err := storage.NewOrganizations(so)
	if err != nil {
		return nil, fmt.Errorf("coderorganizations storage: %w", err)
	}
	return &Server{
		bindAddress:    o.BindAddress,
		securePort:     o.SecurePort,
		certDir:        o.CertDir,
		requestTimeout: o.RequestTimeout,
		kubeconfig:     o.Kubeconfig,
		backends:       o.Backends,
		cert:           o.ServingCert,
		log:            log,
		scheme:         scheme,
		codecs:         serializer.NewCodecFactory(scheme),
		workspaces:     workspaces,
		templates:      templates,
		versions:       versions,
		users:          users,
		groups:         groups,
		orgs:           orgs,
		records:        o.Records,
		identity:       ident,
		admission:      o.Admission,
	}, nil
}

// kubeOrNil keeps a nil client nil through the storage's interface.
func kubeOrNil(c client.Client) storage.SecretReader {
	if c == nil {
		return nil
	}
	return c
}

// Identity holds the callers' Coder tokens (for benchmarks and metrics).
func (s *Server) Identity() *identity.Service { return s.identity }

// Workspaces is the coderworkspaces storage (for benchmarks and metrics).
func (s *Server) Workspaces() *storage.WorkspaceStorage { return s.workspaces }

// NeedLeaderElection is false: every replica serves the API.
func (s *Server) NeedLeaderElection() bool { return false }

// Start builds the server and serves until ctx is cancelled, then drains
// in-flight requests.
func (s *Server) Start(ctx context.Context) error {
	if s.cert != nil {
		s.log.Info("waiting for the serving certificate", "source", s.cert.Name())
		if err := s.cert.WaitForContent(ctx); err != nil {
			return nil // stopped before there was one
		}
	}
	gs, err := s.build(ctx)
	if err != nil {
		return err
	}
	// Every object's metadata comes from the records: serve only once
	// they are all known.
	if err := s.records.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// The shared pollers live as long as the server.
	var pollers sync.WaitGroup
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer func() { stopPolling(); pollers.Wait() }()
	pollers.Go(func() { s.workspaces.Run(pollCtx) })
	pollers.Go(func() { s.templates.Run(pollCtx) })
	pollers.Go(func() { s.versions.Run(pollCtx) })
	pollers.Go(func() { s.users.Run(pollCtx) })
	pollers.Go(func() { s.groups.Run(pollCtx) })
	pollers.Go(func() { s.orgs.Run(pollCtx) })
	// The callers' tokens outlive the requests that use them: they are
	// revoked once the server has drained (RunWithContext returned).
	var tokens sync.WaitGroup
	identCtx, stopIdentity := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopIdentity(); tokens.Wait() }()
	tokens.Go(func() { _ = s.identity.Run(identCtx) })

	s.log.Info("serving", "address", net.JoinHostPort(s.bindAddress, fmt.Sprint(s.securePort)))
	if err := gs.PrepareRun().RunWithContext(ctx); err != nil {
		return fmt.Errorf("aggregated API server: %w", err)
	}
	return nil
}

func (s *Server) build(ctx context.Context) (*genericapiserver.GenericAPIServer, error) {
	serving := options.NewSecureServingOptions().WithLoopback()
	serving.BindAddress = net.ParseIP(s.bindAddress)
	serving.BindPort = s.securePort
	if s.cert != nil {
		// autoTLS: reloaded whenever the Secret's certificate changes.
		serving.ServerCert.GeneratedCert = s.cert
	} else {
		serving.ServerCert.CertDirectory = s.certDir
		serving.ServerCert.PairName = "tls"
		if s.certDir != "" {
			// Files named as in a kubernetes.io/tls Secret mounted at CertDir.
			serving.ServerCert.CertKey.CertFile = s.certDir + "/tls.crt"
			serving.ServerCert.CertKey.KeyFile = s.certDir + "/tls.key"
			serving.ServerCert.CertDirectory = ""
			if !filesExist(serving.ServerCert.CertKey.CertFile, serving.ServerCert.CertKey.KeyFile) {
				serving.ServerCert.CertKey = options.CertKey{}
			}
		}
		if err := serving.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
			return nil, fmt.Errorf("self-signed serving certificate: %w", err)
		}
	}

	authn := options.NewDelegatingAuthenticationOptions()
	authn.RemoteKubeConfigFile = s.kubeconfig
	// Acceptances and rejections alike (one TTL for both in this
	// version), so that repeating a bad token does not cost a TokenReview
	// per request.
	authn.CacheTTL = tokenCacheTTL
	authn.CustomRoundTripperFn = rememberRejections(s.log)
	authz := options.NewDelegatingAuthorizationOptions()
	authz.RemoteKubeConfigFile = s.kubeconfig
	authz.AlwaysAllowPaths = healthPaths

	rc := genericapiserver.NewRecommendedConfig(s.codecs)
	rc.EffectiveVersion = compatibility.NewEffectiveVersionFromString("1.36", "", "")
	// OpenAPI v2 and v3 documents: kubectl explain reads them and
	// server-side apply builds its type converter from v3.
	namer := openapinamer.NewDefinitionNamer(s.scheme)
	rc.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(aggv1.GetOpenAPIDefinitions, namer)
	rc.OpenAPIConfig.Info.Title = "coder-k8s aggregation.coder.com"
	rc.OpenAPIConfig.Info.Version = version.Get().Version
	rc.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(aggv1.GetOpenAPIDefinitions, namer)
	rc.OpenAPIV3Config.Info.Title = rc.OpenAPIConfig.Info.Title
	rc.OpenAPIV3Config.Info.Version = rc.OpenAPIConfig.Info.Version
	rc.BuildHandlerChainFunc = func(api http.Handler, c *genericapiserver.Config) http.Handler {
		return genericapiserver.DefaultBuildHandlerChain(withRequestLog(withListCompression(withBodyErrorsAsBadRequest(api), &gzipMemo{}), s.log), c)
	}
	rc.RequestTimeout = s.requestTimeout
	// A log read may follow a build for longer than the request timeout,
	// as pods/log does in kube-apiserver.
	rc.LongRunningFunc = genericfilters.BasicLongRunningRequestCheck(sets.NewString("watch"), sets.NewString("log"))
	// Watches may stay open up to the request timeout too.
	rc.MinRequestTimeout = int(s.requestTimeout / time.Second)
	// On shutdown, end open watches at once (clients re-establish them,
	// with another replica in a cluster) instead of draining them until
	// the graceful shutdown bound kills the process.
	rc.ShutdownWatchTerminationGracePeriod = watchTerminationGracePeriod
	if err := serving.ApplyTo(&rc.SecureServing, &rc.LoopbackClientConfig); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	if err := authn.ApplyTo(&rc.Authentication, rc.SecureServing, rc.OpenAPIConfig); err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	// ApplyTo always enables anonymous authentication; keep it for the
	// health paths only, so every other anonymous request gets 401.
	rc.Authentication.Authenticator = anonymousOnlyFor(rc.Authentication.Authenticator, healthPaths)
	if err := authz.ApplyTo(&rc.Authorization); err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	// kube-apiserver does not run admission on the requests it proxies
	// here: the cluster's policies and webhooks apply only if this server
	// runs them (after authorization, as kube-apiserver does).
	if s.admission != nil {
		o := *s.admission
		o.Log = s.log.WithName("admission")
		if err := admission.Apply(ctx, rc, o); err != nil {
			return nil, err
		}
	}
	// Until the client CA bundles from kube-apiserver have loaded, every
	// proxied request would be refused; do not report ready before then.
	rc.AddReadyzChecks(healthz.NamedCheck("delegated-authentication", func(*http.Request) error {
		return authenticationLoaded(&rc.Config)
	}), healthz.NamedCheck("control-plane-discovery", func(*http.Request) error {
		// Kubernetes-side state only: coderd being down must not make
		// the APIService unavailable.
		return s.backends.Ready()
	}))
	gs, err := rc.Complete().New("coder-k8s-aggregated-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("create aggregated API server: %w", err)
	}
	// The scheme's own parameter codec: the log subresources' options
	// decode through it (the meta options are decoded by the handlers).
	group := genericapiserver.NewDefaultAPIGroupInfo(aggv1.GroupName, s.scheme, runtime.NewParameterCodec(s.scheme), s.codecs)
	group.VersionedResourcesStorageMap[aggv1.SchemeGroupVersion.Version] = map[string]rest.Storage{
		"coderworkspaces":           s.workspaces,
		"coderworkspaces/log":       storage.NewWorkspaceLog(s.workspaces),
		"codertemplates":            s.templates,
		"codertemplateversions":     s.versions,
		"codertemplateversions/log": storage.NewTemplateVersionLog(s.versions),
		"coderusers":                s.users,
		"codergroups":               s.groups,
		"coderorganizations":        s.orgs,
	}
	if err := gs.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("install %s: %w", aggv1.GroupName, err)
	}
	return gs, nil
}
