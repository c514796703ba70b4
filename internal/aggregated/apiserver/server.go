// Package apiserver is the aggregated API server for aggregation.coder.com:
// a k8s.io/apiserver GenericAPIServer with delegated authentication and
// authorization, served behind kube-apiserver's aggregation layer.
package apiserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/component-base/compatibility"

	"github.com/coder/coder-k8s/internal/config"
)

// healthPaths answer without credentials so kubelet probes work; every
// other path requires an authenticated, authorized caller.
var healthPaths = []string{"/healthz", "/readyz", "/livez"}

// Server runs the aggregated API server as a manager runnable.
type Server struct {
	cfg        config.AggregatedAPIServer
	kubeconfig string
	log        logr.Logger

	scheme *runtime.Scheme
	codecs serializer.CodecFactory
}

// New returns a server for cfg. kubeconfig is the file the delegated
// authentication and authorization clients use; empty means in-cluster.
func New(cfg config.AggregatedAPIServer, kubeconfig string, log logr.Logger) *Server {
	scheme := runtime.NewScheme()
	// The meta types every API server serves (Status, discovery documents,
	// list and watch options) regardless of its own groups.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{},
		&metav1.APIGroup{}, &metav1.APIResourceList{})
	return &Server{
		cfg:        cfg,
		kubeconfig: kubeconfig,
		log:        log.WithName("aggregated-apiserver"),
		scheme:     scheme,
		codecs:     serializer.NewCodecFactory(scheme),
	}
}

// NeedLeaderElection is false: every replica serves the API.
func (s *Server) NeedLeaderElection() bool { return false }

// Start builds the server and serves until ctx is cancelled, then drains
// in-flight requests.
func (s *Server) Start(ctx context.Context) error {
	gs, err := s.build()
	if err != nil {
		return err
	}
	s.log.Info("serving", "address", net.JoinHostPort(s.cfg.BindAddress, fmt.Sprint(s.cfg.SecurePort)))
	if err := gs.PrepareRun().RunWithContext(ctx); err != nil {
		return fmt.Errorf("aggregated API server: %w", err)
	}
	return nil
}

func (s *Server) build() (*genericapiserver.GenericAPIServer, error) {
	serving := options.NewSecureServingOptions().WithLoopback()
	serving.BindAddress = net.ParseIP(s.cfg.BindAddress)
	serving.BindPort = s.cfg.SecurePort
	serving.ServerCert.CertDirectory = s.cfg.CertDir
	serving.ServerCert.PairName = "tls"
	if s.cfg.CertDir != "" {
		// Files named as in a kubernetes.io/tls Secret mounted at CertDir.
		serving.ServerCert.CertKey.CertFile = s.cfg.CertDir + "/tls.crt"
		serving.ServerCert.CertKey.KeyFile = s.cfg.CertDir + "/tls.key"
		serving.ServerCert.CertDirectory = ""
		if !filesExist(serving.ServerCert.CertKey.CertFile, serving.ServerCert.CertKey.KeyFile) {
			serving.ServerCert.CertKey = options.CertKey{}
		}
	}
	if err := serving.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("self-signed serving certificate: %w", err)
	}

	authn := options.NewDelegatingAuthenticationOptions()
	authn.RemoteKubeConfigFile = s.kubeconfig
	authz := options.NewDelegatingAuthorizationOptions()
	authz.RemoteKubeConfigFile = s.kubeconfig
	authz.AlwaysAllowPaths = healthPaths

	rc := genericapiserver.NewRecommendedConfig(s.codecs)
	rc.EffectiveVersion = compatibility.NewEffectiveVersionFromString("1.36", "", "")
	rc.RequestTimeout = s.cfg.RequestTimeout.Duration
	// Watches may stay open up to the request timeout too.
	rc.MinRequestTimeout = int(s.cfg.RequestTimeout.Duration / time.Second)
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
	// Until the client CA bundles from kube-apiserver have loaded, every
	// proxied request would be refused; do not report ready before then.
	rc.AddReadyzChecks(healthz.NamedCheck("delegated-authentication", func(*http.Request) error {
		return authenticationLoaded(&rc.Config)
	}))
	gs, err := rc.Complete().New("coder-k8s-aggregated-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("create aggregated API server: %w", err)
	}
	return gs, nil
}
