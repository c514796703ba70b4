package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/coder/coder-k8s/internal/truncate"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/coder/coder-k8s/internal/logging"
	"github.com/coder/coder-k8s/internal/metrics"
)

// requestIDHeader carries a request's ID: the caller's when it sends a
// sane one, else one made up here; the response always returns it.
const requestIDHeader = "X-Request-Id"

// maxRequestIDLength bounds a caller's request ID, which ends up in logs.
const maxRequestIDLength = 128

// unknownTool is the tool label of calls naming a tool the server does
// not have, so that callers cannot create series at will.
const unknownTool = "unknown"

// withRequestID gives every HTTP request an ID, in its context's logger,
// in the request's headers (where tool handlers read it) and in the
// response's.
func withRequestID(next http.Handler, log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(requestIDHeader)
		if !saneRequestID(id) {
			id = uuid.NewString()
		}
		r.Header.Set(requestIDHeader, id)
		w.Header().Set(requestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(logging.WithRequest(r.Context(), log, id)))
	})
}

// saneRequestID accepts IDs of letters, digits and - _ . : up to
// maxRequestIDLength, which are safe to log and to echo.
func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLength {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

// toolCallRecord is how a tool's handler tells the middleware around it
// that it ran and what it returned.
type toolCallRecord struct {
	ran bool
	err error
}

type toolCallRecordKey struct{}

// recordToolCall notes, for observeToolCalls, that the handler ran and
// returned err.
func recordToolCall(ctx context.Context, err error) {
	if rec, ok := ctx.Value(toolCallRecordKey{}).(*toolCallRecord); ok {
		rec.ran, rec.err = true, err
	}
}

// observeToolCalls counts, times and logs every tools/call, with the
// request's ID and the caller's name. Calls that change something or
// fail are logged at info level, successful reads at debug level.
func (s *Server) observeToolCalls(tools map[string]*mcp.Tool) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if method != "tools/call" || !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			rec := &toolCallRecord{}
			start := time.Now()
			res, err := next(context.WithValue(ctx, toolCallRecordKey{}, rec), method, req)
			d := time.Since(start)

			name := call.Params.Name
			t, known := tools[name]
			if !known {
				name = unknownTool
			}
			outcome, detail := toolOutcome(rec, res, err)
			metrics.ObserveToolCall(name, outcome, d)

			log := s.log.WithValues(logging.RequestIDKey, requestIDOf(ctx, call), "user", callerName(call))
			kv := []any{"tool", name, "outcome", outcome, "duration", d}
			if detail != "" {
				kv = append(kv, "error", detail)
			}
			readOnly := known && t.Annotations != nil && t.Annotations.ReadOnlyHint
			if outcome != metrics.ToolOK || !readOnly {
				log.Info("tool call", kv...)
			} else {
				log.V(1).Info("tool call", kv...)
			}
			return res, err
		}
	}
}

// toolOutcome classifies a finished tools/call and returns the error to
// log. Calls the handler never saw (unknown tool, arguments that do not
// match the schema) are invalid.
func toolOutcome(rec *toolCallRecord, res mcp.Result, err error) (outcome, detail string) {
	failed := err != nil
	if r, ok := res.(*mcp.CallToolResult); ok && r.IsError {
		failed = true
	}
	switch {
	case rec.ran && rec.err != nil:
		switch {
		case apierrors.IsForbidden(rec.err), apierrors.IsUnauthorized(rec.err), errors.Is(rec.err, errNoCaller):
			// kube-apiserver refused the caller.
			return metrics.ToolDenied, rec.err.Error()
		case apierrors.IsBadRequest(rec.err), apierrors.IsInvalid(rec.err):
			return metrics.ToolInvalid, rec.err.Error()
		}
		return metrics.ToolError, rec.err.Error()
	case rec.ran && !failed:
		return metrics.ToolOK, ""
	case rec.ran:
		// The handler succeeded but the SDK refused its result.
		return metrics.ToolError, errorText(res, err)
	case !failed:
		return metrics.ToolOK, ""
	case err != nil:
		return metrics.ToolError, err.Error()
	}
	return metrics.ToolInvalid, errorText(res, err)
}

// requestIDOf is the ID withRequestID gave the HTTP request that carried
// call.
func requestIDOf(ctx context.Context, call *mcp.CallToolRequest) string {
	if call.Extra != nil && call.Extra.Header != nil {
		if id := call.Extra.Header.Get(requestIDHeader); id != "" {
			return id
		}
	}
	return logging.RequestID(ctx)
}

// errorText is the first text of an error result (or err), cut short
// for a log line.
func errorText(res mcp.Result, err error) string {
	const maxLen = 300
	msg := ""
	if err != nil {
		msg = err.Error()
	} else if r, ok := res.(*mcp.CallToolResult); ok && len(r.Content) > 0 {
		if tc, ok := r.Content[0].(*mcp.TextContent); ok {
			msg = tc.Text
		}
	}
	return truncate.String(msg, maxLen)
}
