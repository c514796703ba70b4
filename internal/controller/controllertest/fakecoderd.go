package controllertest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/coder/coder/v2/codersdk"
)

// ResourceNotFound is coderd's answer for an object that does not exist
// or that the caller may not see.
var ResourceNotFound = codersdk.Response{Message: "Resource not found or you do not have access to this resource"}

// FakeCoderd is the plumbing of a fake coderd, for features of an
// Enterprise coderd the test stack cannot run (it builds the open-source
// coderd). The routes are the test's; around them it behaves as coderd
// does: the session token header is required, and any other request gets
// coderd's 404 "Route not found." and fails the test, so a change of
// contract shows up. It records every request.
type FakeCoderd struct {
	URL *url.URL
	srv *httptest.Server

	mu sync.Mutex
	// calls is every request as "METHOD path".
	calls      []string
	unexpected []string
}

// NewFakeCoderd serves routes (http.ServeMux patterns) to clients holding
// token, until the test ends.
func NewFakeCoderd(t *testing.T, token string, routes map[string]http.HandlerFunc) *FakeCoderd {
	t.Helper()
	f := &FakeCoderd{}
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.HandleFunc(pattern, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.unexpected = append(f.unexpected, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		WriteJSON(w, http.StatusNotFound, codersdk.Response{Message: "Route not found."})
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Header.Get(codersdk.SessionTokenHeader) != token {
			WriteJSON(w, http.StatusUnauthorized, codersdk.Response{Message: "You must be logged in to use this endpoint."})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	f.URL, _ = url.Parse(f.srv.URL)
	t.Cleanup(func() {
		f.srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.unexpected) > 0 {
			t.Errorf("requests outside the coderd contract the fake serves: %v", f.unexpected)
		}
	})
	return f
}

// Close stops serving, as a coderd going away.
func (f *FakeCoderd) Close() { f.srv.Close() }

// Count returns how many requests matched method and path exactly.
func (f *FakeCoderd) Count(method, path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == method+" "+path {
			n++
		}
	}
	return n
}

// CallsExcept returns the requests other than those with the given
// method.
func (f *FakeCoderd) CallsExcept(method string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if !strings.HasPrefix(c, method+" ") {
			out = append(out, c)
		}
	}
	return out
}

// WriteJSON answers with status and v as JSON, as coderd's httpapi.Write
// does.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// ReadJSON reads a request body strictly, as coderd's httpapi.Read does,
// and checks the fields codersdk marks validate:"required" (required
// maps a field's JSON name to whether the request has it). On a bad body
// it answers 400 as coderd does and returns false.
func ReadJSON(w http.ResponseWriter, r *http.Request, v any, required map[string]func() bool) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Request body must be valid JSON.", Detail: err.Error()})
		return false
	}
	var missing []codersdk.ValidationError
	for field, present := range required {
		if !present() {
			missing = append(missing, codersdk.ValidationError{Field: field, Detail: "Validation failed for tag \"required\" with value: \"\""})
		}
	}
	if len(missing) > 0 {
		WriteJSON(w, http.StatusBadRequest, codersdk.Response{Message: "Validation failed.", Validations: missing})
		return false
	}
	return true
}
