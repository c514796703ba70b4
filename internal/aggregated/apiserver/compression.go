package apiserver

import (
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/endpoints/responsewriter"
	"k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
)

// gzipThreshold is the answer size from which a LIST is compressed, as
// k8s.io/apiserver's own response writer decides (128 KiB).
const gzipThreshold = 128 << 10

// withListCompression compresses the LIST answers k8s.io/apiserver would
// compress (the client accepts gzip, the answer exceeds gzipThreshold)
// with klauspost/compress's gzip instead of compress/gzip, both at the
// speed level 1 k8s.io/apiserver uses, in the same format: on the 880 KB
// of 1,000 coderusers the standard library took about three times as
// long, more than the rest of coder-k8s's own work on the list
// (docs/development.md, make bench-users). Watches and other requests are
// left to k8s.io/apiserver.
func withListCompression(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, ok := request.RequestInfoFrom(r.Context())
		if !ok || !info.IsResourceRequest || info.Verb != "list" || !acceptsGzip(r.Header.Get("Accept-Encoding")) ||
			!utilfeature.DefaultFeatureGate.Enabled(features.APIResponseCompression) {
			next.ServeHTTP(w, r)
			return
		}
		// Without gzip among the accepted encodings k8s.io/apiserver
		// writes the answer plain, to cw.
		plain := r.WithContext(r.Context())
		plain.Header = r.Header.Clone()
		plain.Header.Del("Accept-Encoding")
		cw := &compressingWriter{w: w}
		next.ServeHTTP(responsewriter.WrapForHTTP1Or2(cw), plain)
		cw.close()
	})
}

// acceptsGzip reports whether an Accept-Encoding header lists gzip, read
// as k8s.io/apiserver reads it.
func acceptsGzip(header string) bool {
	for token := range strings.SplitSeq(header, ",") {
		if strings.TrimSpace(token) == "gzip" {
			return true
		}
	}
	return false
}

var gzipWriters = sync.Pool{New: func() any {
	gw, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
	return gw
}}

// compressingWriter holds an answer back until it exceeds gzipThreshold,
// then sends it gzip-compressed; an answer that ends (or is flushed)
// before that is sent as written.
type compressingWriter struct {
	w      http.ResponseWriter
	status int
	buf    []byte
	gz     *gzip.Writer
	// plain: the status is sent and the answer goes through uncompressed.
	plain bool
}

var _ responsewriter.UserProvidedDecorator = (*compressingWriter)(nil)

func (c *compressingWriter) Unwrap() http.ResponseWriter { return c.w }
func (c *compressingWriter) Header() http.Header         { return c.w.Header() }

func (c *compressingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
}

func (c *compressingWriter) Write(p []byte) (int, error) {
	switch {
	case c.gz != nil:
		return c.gz.Write(p)
	case c.plain:
		return c.w.Write(p)
	}
	if c.buf == nil {
		c.buf = make([]byte, 0, 32<<10)
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) <= gzipThreshold {
		return len(p), nil
	}
	h := c.w.Header()
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
	h.Del("Content-Length")
	c.w.WriteHeader(c.statusCode())
	c.gz = gzipWriters.Get().(*gzip.Writer)
	c.gz.Reset(c.w)
	held := c.buf
	c.buf = nil
	if _, err := c.gz.Write(held); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush sends what is held: uncompressed when compression has not begun.
func (c *compressingWriter) Flush() {
	if c.gz != nil {
		_ = c.gz.Flush()
	} else {
		c.sendPlain()
	}
	if f, ok := c.w.(http.Flusher); ok {
		f.Flush()
	}
}

// close ends the answer once the handler returned.
func (c *compressingWriter) close() {
	if c.gz == nil {
		c.sendPlain()
		return
	}
	// A failed write is the connection's; the handler saw it already.
	_ = c.gz.Close()
	c.gz.Reset(nil)
	gzipWriters.Put(c.gz)
	c.gz = nil
	c.plain = true
}

// sendPlain sends the status and what is held, and passes what follows
// through.
func (c *compressingWriter) sendPlain() {
	if c.plain {
		return
	}
	c.plain = true
	if c.status == 0 && len(c.buf) == 0 {
		return
	}
	c.w.WriteHeader(c.statusCode())
	if len(c.buf) > 0 {
		_, _ = c.w.Write(c.buf)
	}
	c.buf = nil
}

func (c *compressingWriter) statusCode() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}
