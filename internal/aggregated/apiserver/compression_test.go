package apiserver

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
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
	for _, tc := range []struct {
		name, verb, accept string
		body               []byte
		flush              bool
		gzipped            bool
	}{
		{name: "large list, gzip accepted", verb: "list", accept: "gzip, deflate", body: large, gzipped: true},
		{name: "small list", verb: "list", accept: "gzip", body: small},
		{name: "large list flushed before the threshold", verb: "list", accept: "gzip", body: large, flush: true},
		{name: "large list without gzip", verb: "list", accept: "", body: large},
		{name: "watch", verb: "watch", accept: "gzip", body: large},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sawAccept string
			h := withListCompression(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sawAccept = r.Header.Get("Accept-Encoding")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusAccepted)
				if tc.flush {
					_, _ = w.Write(tc.body[:10])
					w.(http.Flusher).Flush()
					_, _ = w.Write(tc.body[10:])
					return
				}
				// Written in pieces, as a spliced list is.
				for i := 0; i < len(tc.body); i += 1000 {
					_, _ = w.Write(tc.body[i:min(i+1000, len(tc.body))])
				}
			}))
			req := httptest.NewRequest(http.MethodGet, "/apis/aggregation.coder.com/v1alpha1/coderusers", nil)
			if tc.accept != "" {
				req.Header.Set("Accept-Encoding", tc.accept)
			}
			req = req.WithContext(request.WithRequestInfo(req.Context(), &request.RequestInfo{IsResourceRequest: true, Verb: tc.verb}))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

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
				zr, err := gzip.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				if got, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, tc.body) {
				t.Errorf("the client read %d bytes, not the %d the handler wrote", len(got), len(tc.body))
			}
		})
	}
}
