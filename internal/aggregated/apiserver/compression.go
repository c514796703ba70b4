package apiserver

import (
	"bytes"
	"net/http"
	"strconv"
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

const (
	// memoAnswerMax is the largest answer held until it ends and
	// remembered compressed: 1,000 coderusers are about 950 KB.
	memoAnswerMax = 4 << 20
	// memoMax bounds what gzipMemo holds, uncompressed and compressed.
	memoMax = 16 << 20
)

// withListCompression compresses the LIST answers k8s.io/apiserver would
// compress (the client accepts gzip, the answer exceeds gzipThreshold)
// with klauspost/compress's gzip instead of compress/gzip, both at the
// speed level 1 k8s.io/apiserver uses, in the same format: on the 880 KB
// of 1,000 coderusers the standard library took about three times as
// long, more than the rest of coder-k8s's own work on the list
// (docs/development.md, make bench-users). An answer is held until it
// ends (up to memoAnswerMax) so that one byte for byte equal to a recent
// answer is sent with that answer's compressed bytes, compressed once
// (memo). Watches and other requests are left to k8s.io/apiserver.
func withListCompression(next http.Handler, memo *gzipMemo) http.Handler {
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
		cw := &compressingWriter{w: w, memo: memo}
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

// compressingWriter holds an answer back until it ends, then sends it
// gzip-compressed if it exceeds gzipThreshold, from memo when memo holds
// its compressed form, and as written otherwise. An answer flushed before
// it ends, or growing beyond memoAnswerMax, is compressed as it is
// written from then on (from the threshold; plain before it).
type compressingWriter struct {
	w      http.ResponseWriter
	memo   *gzipMemo
	status int
	buf    []byte
	// gz compresses the rest of a streamed answer.
	gz *gzip.Writer
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
		c.buf = (*heldBuffers.Get().(*[]byte))[:0]
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) > memoAnswerMax {
		if err := c.stream(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// stream sends the status and starts compressing: what is held first,
// then every write.
func (c *compressingWriter) stream() error {
	c.gzipHeaders()
	c.w.WriteHeader(c.statusCode())
	c.gz = gzipWriters.Get().(*gzip.Writer)
	c.gz.Reset(c.w)
	_, err := c.gz.Write(c.buf)
	c.release()
	return err
}

func (c *compressingWriter) gzipHeaders() {
	h := c.w.Header()
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
	h.Del("Content-Length")
}

// Flush sends what is held: compressed when it exceeds gzipThreshold.
func (c *compressingWriter) Flush() {
	if c.gz == nil && !c.plain {
		if len(c.buf) > gzipThreshold {
			_ = c.stream()
		} else {
			c.sendPlain()
		}
	}
	if c.gz != nil {
		_ = c.gz.Flush()
	}
	if f, ok := c.w.(http.Flusher); ok {
		f.Flush()
	}
}

// close ends the answer once the handler returned.
func (c *compressingWriter) close() {
	switch {
	case c.gz != nil:
		// A failed write is the connection's; the handler saw it already.
		_ = c.gz.Close()
		c.gz.Reset(nil)
		gzipWriters.Put(c.gz)
		c.gz = nil
		c.plain = true
		return
	case c.plain:
		return
	case len(c.buf) <= gzipThreshold:
		c.sendPlain()
		return
	}
	c.plain = true
	gz := c.memo.get(c.buf)
	if gz == nil {
		gz = compress(c.buf)
		c.memo.put(bytes.Clone(c.buf), gz)
	}
	c.release()
	c.gzipHeaders()
	c.w.Header().Set("Content-Length", strconv.Itoa(len(gz)))
	c.w.WriteHeader(c.statusCode())
	// A failed write is the connection's: the client is gone.
	_, _ = c.w.Write(gz)
}

// compress is plain gzip-compressed.
func compress(plain []byte) []byte {
	var out bytes.Buffer
	out.Grow(len(plain) / 4)
	gz := gzipWriters.Get().(*gzip.Writer)
	gz.Reset(&out)
	// Writes to a bytes.Buffer do not fail.
	_, _ = gz.Write(plain)
	_ = gz.Close()
	gz.Reset(nil)
	gzipWriters.Put(gz)
	return bytes.Clone(out.Bytes())
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
	c.release()
}

// heldBuffers are the buffers answers are held in (*[]byte), reused once
// an answer is sent: a LIST served from the memo allocates none.
var heldBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, 32<<10)
	return &b
}}

// release returns the held buffer, once sent or compressed, for reuse.
func (c *compressingWriter) release() {
	if c.buf == nil {
		return
	}
	b := c.buf[:0]
	heldBuffers.Put(&b)
	c.buf = nil
}

func (c *compressingWriter) statusCode() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// gzipMemo remembers the compressed form of recent answers, by their
// whole uncompressed bytes: a client that lists the same objects again
// (a GitOps controller's resync, kubectl get in a loop) is sent them
// without compressing them again (about 0.9 ms of CPU per LIST of 1,000
// coderusers: docs/development.md, make bench-users). An answer is only
// ever matched with its equal, byte for byte, so what a caller is sent
// is what its own answer compresses to, whoever listed it before. Least
// recently used answers go first once memoMax is reached.
type gzipMemo struct {
	mu sync.Mutex
	// entries, the most recently used first.
	entries []gzipped
	size    int
}

type gzipped struct{ plain, gz []byte }

func (e gzipped) size() int { return len(e.plain) + len(e.gz) }

// get returns the compressed form of plain, or nil.
func (m *gzipMemo) get(plain []byte) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, e := range m.entries {
		if bytes.Equal(e.plain, plain) {
			copy(m.entries[1:i+1], m.entries[:i])
			m.entries[0] = e
			return e.gz
		}
	}
	return nil
}

// put remembers gz as plain's compressed form; neither is changed after.
func (m *gzipMemo) put(plain, gz []byte) {
	e := gzipped{plain: plain, gz: gz}
	if e.size() > memoMax {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.entries {
		// Compressed at the same time by another request.
		if bytes.Equal(o.plain, plain) {
			return
		}
	}
	m.entries = append(m.entries, gzipped{})
	copy(m.entries[1:], m.entries)
	m.entries[0] = e
	m.size += e.size()
	for m.size > memoMax {
		last := len(m.entries) - 1
		m.size -= m.entries[last].size()
		m.entries[last] = gzipped{}
		m.entries = m.entries[:last]
	}
}
