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
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/coder/coder-k8s/internal/config"
)

// shutdownTimeout bounds how long in-flight requests may take to finish
// after the process is asked to stop.
const shutdownTimeout = 25 * time.Second

// Server serves the MCP HTTP endpoints as a manager runnable.
type Server struct {
	cfg   config.MCP
	log   logr.Logger
	ready healthz.Checker
}

// New returns a server for cfg. ready reports whether the server's
// dependencies (Kubernetes client, caches) are usable; /readyz serves it.
func New(cfg config.MCP, ready healthz.Checker, log logr.Logger) *Server {
	return &Server{cfg: cfg, ready: ready, log: log.WithName("mcp")}
}

// NeedLeaderElection is false: every replica serves agents.
func (s *Server) NeedLeaderElection() bool { return false }

// Start listens on the configured address and serves until ctx is
// cancelled, then lets in-flight requests finish.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.BindAddress)
	if err != nil {
		return fmt.Errorf("mcp: listen on %s: %w", s.cfg.BindAddress, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is cancelled.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return ctx },
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
		return fmt.Errorf("mcp: shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("mcp: serve: %w", err)
	}
	return nil
}

// Handler routes the health endpoints.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
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
