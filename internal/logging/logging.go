// Package logging builds the process's zap logger and installs it for controller-runtime and klog, so every component,
// including the Kubernetes libraries, logs in one format.
package logging

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Options say how the process logs.
type Options struct {
	// Level is the lowest level logged: debug, info, warn or error.
	Level string
	// Format is json (for log collectors) or console (for people).
	Format string
}

// New builds a logger for o. The returned function flushes buffered
// entries; call it before the process exits.
func New(o Options) (logr.Logger, func(), error) {
	level, err := zapcore.ParseLevel(o.Level)
	if err != nil {
		return logr.Discard(), nil, fmt.Errorf("logging.level: %w", err)
	}
	var zc zap.Config
	switch o.Format {
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.Development = false
	default:
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = level > zapcore.DebugLevel
	zl, err := zc.Build()
	if err != nil {
		return logr.Discard(), nil, fmt.Errorf("build logger: %w", err)
	}
	return zapr.NewLogger(zl), func() { _ = zl.Sync() }, nil
}

// Install makes log the logger of controller-runtime and klog.
func Install(log logr.Logger) {
	ctrl.SetLogger(log)
	klog.SetLoggerWithOptions(log, klog.ContextualLogger(true))
}

// RequestIDKey is the log key of the ID of the request a line belongs to:
// the Audit-ID in the aggregated API server, X-Request-Id in the MCP server.
const RequestIDKey = "requestID"

type requestIDKey struct{}

// WithRequest returns ctx carrying the request's ID and log with the ID
// (and keysAndValues) added, for logr.FromContext.
func WithRequest(ctx context.Context, log logr.Logger, id string, keysAndValues ...any) context.Context {
	ctx = context.WithValue(ctx, requestIDKey{}, id)
	return logr.NewContext(ctx, log.WithValues(append([]any{RequestIDKey, id}, keysAndValues...)...))
}

// RequestID returns the ID WithRequest put in ctx, or "" outside a
// request.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}
