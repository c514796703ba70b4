// Package mcpserver is the Model Context Protocol server for AI agents,
// served over streamable HTTP next to its health endpoints.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/coder/coder-k8s/internal/version"
)

// shutdownTimeout bounds how long in-flight requests may take to finish
// after the process is asked to stop.
const shutdownTimeout = 25 * time.Second

// Server serves the MCP HTTP endpoints as a manager runnable.
type Server struct {
	opts  Options
	log   logr.Logger
	ready healthz.Checker
	// kube is coder-k8s's own access: TokenReviews, and with auth "none"
	// what the tools do.
	kube Kube
	// reviewer checks callers' tokens and holds the clients that act as
	// them (auth "kubernetes").
	reviewer *tokenReviewer
	resource protectedResource
	mcp      http.Handler
	tools    map[string]*mcp.Tool
}

// Options are what the server is built from.
type Options struct {
	// BindAddress is where Start listens for /mcp, /healthz and /readyz.
	BindAddress string
	// AuthNone turns authentication off (mcp.auth none): the tools act
	// with Kube, coder-k8s's own access; for local development only.
	// Otherwise (mcp.auth kubernetes) a caller's bearer token is checked
	// with a TokenReview and the tools act with that same token.
	AuthNone bool
	// Audiences, when set, are sent with every TokenReview: a token must
	// be valid for one of them. Empty means kube-apiserver's own.
	Audiences []string
	// OAuth describes /mcp as an OAuth 2.0 protected resource, so MCP
	// clients can sign in with the cluster's identity provider.
	OAuth OAuth
	// ReadOnly registers no tool that changes anything.
	ReadOnly bool
	// AllowDestructiveTools registers the tools that delete.
	AllowDestructiveTools bool
	// AllowTools, when not empty, registers only the tools named here.
	AllowTools []string
	// DenyTools never registers the tools named here.
	DenyTools []string
	// MaxRequestBytes bounds the body of a request to /mcp.
	MaxRequestBytes int64
	// ReadHeaderTimeout bounds how long a client may take to send request
	// headers.
	ReadHeaderTimeout time.Duration
	// ToolTimeout bounds one tool call, including a bounded wait for a
	// workspace build.
	ToolTimeout time.Duration

	// Kube is coder-k8s's own access. With auth "kubernetes" it only
	// reviews tokens (Clientset) and lends its scheme and REST mapper
	// (Direct) to the callers' clients.
	Kube Kube
	// REST is coder-k8s's client configuration; with auth "kubernetes" the
	// callers' clients are built from it without its credentials.
	REST *rest.Config
	// Ready reports whether the server's dependencies (Kubernetes client,
	// caches) are usable; /readyz serves it.
	Ready healthz.Checker
	Log   logr.Logger
}

// New returns a server for o with the tools its configuration allows.
func New(o Options) (*Server, error) {
	s := &Server{opts: o, ready: o.Ready, kube: o.Kube, log: o.Log.WithName("mcp"),
		resource: protectedResource{oauth: o.OAuth}}
	ms := mcp.NewServer(&mcp.Implementation{Name: "coder-k8s", Title: "Coder on Kubernetes", Version: version.Get().Version}, &mcp.ServerOptions{
		Instructions: instructions,
	})
	tools, err := s.registerTools(ms, s.allTools())
	if err != nil {
		return nil, err
	}
	s.tools = tools
	ms.AddReceivingMiddleware(argumentHelp(tools))
	// Outermost, so it also sees the calls argumentHelp answers.
	ms.AddReceivingMiddleware(s.observeToolCalls(tools))
	// Stateless: every request stands alone, so any replica serves any
	// request and nothing is lost when a pod goes away. The cost: no
	// server-to-client requests and no resumable streams, which these
	// tools do not use.
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	if o.AuthNone {
		s.log.Info("WARNING: MCP authentication is off (mcp.auth: none): every caller acts with coder-k8s's own permissions, which include none of what only the MCP tools need (those tools answer 403); use it only for local development")
	} else {
		if o.REST == nil || o.Kube.Direct == nil || o.Kube.Clientset == nil {
			return nil, errors.New("mcp: auth kubernetes needs coder-k8s's client configuration (Options.REST), a client (Kube.Direct) and a clientset (Kube.Clientset)")
		}
		cc, err := newCallerClients(o.REST, o.Kube.Direct.Scheme(), o.Kube.Direct.RESTMapper())
		if err != nil {
			return nil, err
		}
		s.reviewer = newTokenReviewer(o.Kube.Clientset, o.Audiences, cc.forToken)
		h = s.resource.requireToken(s.reviewer.verify, h)
	}
	s.mcp = withRequestID(http.MaxBytesHandler(h, o.MaxRequestBytes), s.log)
	return s, nil
}

// Tools returns the names of the registered tools.
func (s *Server) Tools() []string { return sortedToolNames(s.tools) }

// instructions tell an agent what the server is for.
const instructions = `Operate Coder (cloud development environments) on Kubernetes.
Control planes are CoderControlPlane objects (coderd deployments); templates and workspaces are Coder objects seen as Kubernetes objects (kind CoderTemplate, CoderWorkspace; names <org>.<template> and <org>.<owner>.<workspace>) in the namespace of their control plane.
Lists return a few compact rows and a continue token; pass it back for more. Every call reaches Kubernetes with your own token: your RBAC applies, as with kubectl.`

// NeedLeaderElection is false: every replica serves agents.
func (s *Server) NeedLeaderElection() bool { return false }

// Start listens on the configured address and serves until ctx is
// cancelled, then lets in-flight requests finish.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.BindAddress)
	if err != nil {
		return fmt.Errorf("mcp: listen on %s: %w", s.opts.BindAddress, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		// Not ctx itself: cancelling it on SIGTERM would cut the requests
		// in flight (the SDK then answers 200 with an empty body) instead
		// of letting Shutdown drain them.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("serving", "address", ln.Addr().String())

	select {
	case err := <-errc:
		return fmt.Errorf("mcp: serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close() // the requests still running past the bound
		return fmt.Errorf("mcp: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcp: serve: %w", err)
	}
	return nil
}

// Handler routes /mcp and the health endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(mcpPath, s.mcp)
	if !s.opts.AuthNone {
		// Both forms: MCP clients try the endpoint's path first.
		md := s.resource.metadata()
		mux.Handle(wellKnownPath, md)
		mux.Handle(wellKnownPath+mcpPath, md)
	}
	// healthz.Handler serves its checks below the prefix it is mounted at
	// (/readyz, /readyz/dependencies), like controller-runtime's probes.
	for prefix, checks := range map[string]map[string]healthz.Checker{
		"/healthz": {"ping": healthz.Ping},
		"/readyz":  {"dependencies": s.ready},
	} {
		h := http.StripPrefix(prefix, &healthz.Handler{Checks: checks})
		mux.Handle("GET "+prefix, h)
		mux.Handle("GET "+prefix+"/", h)
	}
	return mux
}
