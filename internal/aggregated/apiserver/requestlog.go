package apiserver

import (
	"net/http"

	"github.com/go-logr/logr"
	"k8s.io/apiserver/pkg/audit"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/coder/coder-k8s/internal/logging"
)

// withRequestLog gives each API request a logger carrying its Audit-ID
// and user, in its context: what the request logs (its calls to coderd,
// template builds) can then be found by the Audit-ID, which
// kube-apiserver forwards to aggregated servers and returns to the
// client, so it also matches kube-apiserver's audit log.
//
// It wraps the API handler, inside the default filters: the Audit-ID and
// the user are known there.
func withRequestLog(next http.Handler, log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		var kv []any
		if u, ok := request.UserFrom(ctx); ok {
			kv = append(kv, "user", u.GetName())
		}
		ctx = logging.WithRequest(ctx, log, audit.GetAuditIDTruncated(ctx), kv...)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
