package apiserver

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/endpoints/request"
)

// TestListCompression: a LIST answer larger than k8s.io/apiserver's
// threshold reaches a client that accepts gzip compressed, readable by
// the standard library, with its status and headers; smaller answers,
// flushed answers, watches and clients without gzip get what the handler
// wrote, and the handler never sees gzip accepted for a LIST.
func TestListCompression(t *testing.T) {
	large := []byte(`{"items":[` + strings.Repeat(`{"kind":"CoderUser","metadata":{"name":"bench-user"}},`, 5000) + `{}]}`)
	small := []byte(`{"items":[]}`)
	// Beyond memoAnswerMax: compressed as it is written.
	huge := []byte(`{"items":[` + strings.Repeat(`{"kind":"CoderUser","metadata":{"name":"bench-user"}},`, memoAnswerMax/50) + `{}]}`)
	for _, tc := range []struct {
		name, verb, accept string
		body               []byte
		flush              int
		gzipped            bool
	}{
		{name: "large list, gzip accepted", verb: "list", accept: "gzip, deflate", body: large, gzipped: true},
		{name: "small list", verb: "list", accept: "gzip", body: small},
		{name: "large list flushed before the threshold", verb: "list", accept: "gzip", body: large, flush: 10},
		{name: "large list flushed after the threshold", verb: "list", accept: "gzip", body: large, flush: gzipThreshold + 10, gzipped: true},
		{name: "list beyond what is held", verb: "list", accept: "gzip", body: huge, gzipped: true},
		{name: "large list without gzip", verb: "list", accept: "", body: large},
		{name: "watch", verb: "watch", accept: "gzip", body: large},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sawAccept string
			h := withListCompression(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sawAccept = r.Header.Get("Accept-Encoding")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusAccepted)
				if tc.flush > 0 {
					_, _ = w.Write(tc.body[:tc.flush])
					w.(http.Flusher).Flush()
					_, _ = w.Write(tc.body[tc.flush:])
					return
				}
				// Written in pieces, as a spliced list is.
				for i := 0; i < len(tc.body); i += 1000 {
					_, _ = w.Write(tc.body[i:min(i+1000, len(tc.body))])
				}
			}), &gzipMemo{})
			rec := serve(h, tc.verb, tc.accept)

			if rec.Code != http.StatusAccepted || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("status %d, Content-Type %q: want the handler's", rec.Code, rec.Header().Get("Content-Type"))
			}
			if tc.verb == "list" && sawAccept != "" {
				t.Errorf("the handler saw Accept-Encoding %q on a LIST: want none (coder-k8s compresses)", sawAccept)
			}
			if tc.verb == "watch" && sawAccept != tc.accept {
				t.Errorf("the handler saw Accept-Encoding %q on a watch, want the client's %q", sawAccept, tc.accept)
			}
			got := rec.Body.Bytes()
			if enc := rec.Header().Get("Content-Encoding"); (enc == "gzip") != tc.gzipped {
				t.Fatalf("Content-Encoding %q, want gzip: %v", enc, tc.gzipped)
			}
			if tc.gzipped {
				if rec.Header().Get("Vary") != "Accept-Encoding" {
					t.Errorf("Vary %q, want Accept-Encoding", rec.Header().Get("Vary"))
				}
				got = gunzip(t, got)
			}
			if !bytes.Equal(got, tc.body) {
				t.Errorf("the client read %d bytes, not the %d the handler wrote", len(got), len(tc.body))
			}
		})
	}
}

// serve sends h a request of verb for coderusers, accepting the encodings
// in accept.
func serve(h http.Handler, verb, accept string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/apis/aggregation.coder.com/v1alpha1/coderusers", nil)
	if accept != "" {
		req.Header.Set("Accept-Encoding", accept)
	}
	req = req.WithContext(request.WithRequestInfo(req.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: verb}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// gunzip is body decompressed.
func gunzip(t *testing.T, body []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return plain
}

// TestListCompressionMemo: a LIST answer equal to a recent one is sent
// with the bytes it was compressed to then, with its Content-Length; an
// answer differing in one byte is compressed anew; each client reads
// exactly what its handler wrote.
func TestListCompressionMemo(t *testing.T) {
	a := []byte(`{"items":[` + strings.Repeat(`{"kind":"CoderUser","metadata":{"name":"bench-user"}},`, 5000) + `{}]}`)
	b := bytes.Clone(a)
	b[len(b)-3] = ' '
	memo := &gzipMemo{}
	var body []byte
	h := withListCompression(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(body); i += 1000 {
			_, _ = w.Write(body[i:min(i+1000, len(body))])
		}
	}), memo)
	for i, want := range [][]byte{a, a, b, a} {
		body = want
		if got := gzipAnswer(t, h); !bytes.Equal(got, want) {
			t.Fatalf("answer %d: the client read %d bytes, not the %d the handler wrote", i, len(got), len(want))
		}
	}
	if len(memo.entries) != 2 {
		t.Errorf("the memo holds %d answers, want 2 (a and b, each compressed once)", len(memo.entries))
	}
	// What is sent for an answer the memo holds is the memo's bytes: with
	// those of another answer in their place, the client reads that one.
	memo.entries[0].gz = compress(b)
	body = a
	if got := gzipAnswer(t, h); !bytes.Equal(got, b) {
		t.Errorf("with the memo's bytes for a replaced, the client read %d bytes, want the memo's", len(got))
	}
}

// gzipAnswer is what a client that accepts gzip reads of h's LIST
// answer, which it checks is compressed with its Content-Length set.
func gzipAnswer(t *testing.T, h http.Handler) []byte {
	t.Helper()
	rec := serve(h, "list", "gzip")
	got := rec.Body.Bytes()
	if rec.Header().Get("Content-Encoding") != "gzip" || rec.Header().Get("Content-Length") != strconv.Itoa(len(got)) {
		t.Fatalf("Content-Encoding %q, Content-Length %q for %d bytes: want gzip and its length",
			rec.Header().Get("Content-Encoding"), rec.Header().Get("Content-Length"), len(got))
	}
	return gunzip(t, got)
}

// TestGzipMemoBound: the memo holds at most memoMax bytes, the least
// recently used answers going first, and never an answer larger than
// that.
func TestGzipMemoBound(t *testing.T) {
	m := &gzipMemo{}
	// Sixteen answers of memoMax/16 bytes (compressed to nothing) fit.
	answer := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, memoMax/16) }
	for i := range 18 {
		m.put(answer(i), []byte{})
		if i == 14 {
			// Used again: kept beyond the answers put before it.
			m.get(answer(2))
		}
	}
	if m.size > memoMax || len(m.entries) != 16 {
		t.Errorf("the memo holds %d answers, %d bytes: want 16, at most memoMax (%d)", len(m.entries), m.size, memoMax)
	}
	// The two least recently used of eighteen are gone.
	for i, want := range map[int]bool{0: false, 1: false, 2: true, 3: true, 14: true, 17: true} {
		if got := m.get(answer(i)) != nil; got != want {
			t.Errorf("answer %d remembered: %v, want %v", i, got, want)
		}
	}
	m.put(make([]byte, memoMax+1), []byte{1})
	if m.get(make([]byte, memoMax+1)) != nil {
		t.Error("an answer larger than memoMax was remembered")
	}
}
