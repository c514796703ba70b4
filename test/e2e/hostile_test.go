package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// hostileMaxBody is the aggregated API server's request body limit:
// k8s.io/apiserver's default MaxRequestBodyBytes, which it keeps.
const hostileMaxBody = 3 << 20

// hostileMCPMaxBody is mcp.maxRequestBytes's default.
const hostileMCPMaxBody = 1 << 20

// TestHostileRequests sends malformed, oversized and otherwise hostile
// requests to a running operator (all mode, real kube-apiserver and
// coderd): to the aggregated API server directly with a ServiceAccount's
// bearer token and through kube-apiserver, and to the MCP endpoint with
// the same token. Each gets the 4xx (or JSON-RPC error) and message
// asserted here; coder-k8s answers no 5xx but a 504 to a client that hung
// up mid-body (k8s.io/apiserver's timeout filter), and the few 5xx
// kube-apiserver gives itself are pinned next to its answer for its own
// ConfigMaps. Afterwards the process is alive, its health endpoints
// answer and normal requests work.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs the real stack built by `make tools`; skipped with -short")
	}
	start := time.Now()
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "hostile", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.CreateWorkspace(ctx, "hostile", "target"); err != nil {
		t.Fatal(err)
	}
	token := e2eMCPServiceAccountToken(t, s, "hostile")
	e2eMCPGrant(t, s, "hostile", "", []rbacv1.PolicyRule{
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "codertemplates"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
	}...)
	// For the reference requests to kube-apiserver's own resources.
	e2eMCPGrant(t, s, "hostile", "default", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}})

	ws := s.workspaceName("target")
	coll := "/apis/" + aggv1.GroupName + "/v1alpha1/namespaces/" + s.ns + "/coderworkspaces"
	obj := coll + "/" + ws
	tplColl := "/apis/" + aggv1.GroupName + "/v1alpha1/namespaces/" + s.ns + "/codertemplates"
	kube := hostileKubeClient(t, s)
	kubeURL := strings.TrimSuffix(s.k.Config.Host, "/")
	direct := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},                  //nolint:gosec // the stack's CA is not kept; TLS is not under test
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1, so header limits are the server's
	}}
	// Both ways in answer a normal GET before the barrage.
	for _, via := range []struct {
		base string
		c    *http.Client
	}{{s.op.Aggregated, direct}, {kubeURL, kube}} {
		c := via.c
		testenv.WaitFor(t, 60*time.Second, func() error {
			r := hostileDo(t, c, http.MethodGet, via.base+obj, token, nil, nil)
			if r.code != http.StatusOK {
				return fmt.Errorf("GET %s%s: %d %s", via.base, obj, r.code, r.snippet())
			}
			return nil
		})
	}
	t.Logf("stack ready in %s", time.Since(start).Round(time.Second))

	t.Run("aggregated API", func(t *testing.T) {
		cases := hostileAggregatedCases(ws)
		for _, via := range []struct {
			name string
			base string
			c    *http.Client
		}{{"directly", s.op.Aggregated, direct}, {"through kube-apiserver", kubeURL, kube}} {
			t.Run(via.name, func(t *testing.T) {
				for _, tc := range cases {
					t.Run(tc.name, func(t *testing.T) {
						path := coll + tc.path
						if tc.templates {
							path = tplColl + tc.path
						} else if tc.path == "obj" {
							path = obj
						} else if strings.HasPrefix(tc.path, "obj?") {
							path = obj + tc.path[3:]
						}
						r := hostileDo(t, via.c, tc.method, via.base+path, token, tc.headers(), tc.body)
						tc.check(t, r)
					})
				}
			})
		}
	})

	t.Run("MCP", func(t *testing.T) {
		c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
		for _, tc := range hostileMCPCases() {
			t.Run(tc.name, func(t *testing.T) {
				h := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
				for k, v := range tc.headers {
					h[k] = v
				}
				method := tc.method
				if method == "" {
					method = http.MethodPost
				}
				tc.check(t, hostileDo(t, c, method, s.op.MCP+"/mcp", token, h, tc.body))
			})
		}
	})

	t.Run("bodies cut short", func(t *testing.T) {
		aggHost := strings.TrimPrefix(s.op.Aggregated, "https://")
		kubeHost := strings.TrimPrefix(kubeURL, "https://")
		mcpHost := strings.TrimPrefix(s.op.MCP, "http://")
		const cms = "/api/v1/namespaces/default/configmaps"
		const partial = `{"apiVersion":"aggregation.coder.com/v1alpha1","kind":`
		head := func(method, host, path, ct string) string {
			return fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: %s\r\n"+
				"Accept: application/json, text/event-stream\r\n", method, path, host, token, ct)
		}
		// The client announces 4096 bytes, sends a few and closes its
		// side: Go's HTTP server takes the client as gone and cancels the
		// request. k8s.io/apiserver's timeout filter then either answers
		// 504 Timeout or, when the handler has begun answering, closes
		// the connection; or the handler reads the cut body first and
		// answers that it ended early ("unexpected EOF": a 400 here,
		// kube-apiserver's own ConfigMaps a 500). It is a race, the same
		// for kube-apiserver's own ConfigMaps. Through kube-apiserver, its
		// proxy to the aggregated server can win it with its own 503 for
		// the forward it gave up ("error trying to reach service: context
		// canceled", or "unexpected EOF" when it read the cut body).
		hangUp := func(method, host, path, ct string) string {
			return head(method, host, path, ct) + "Content-Length: 4096\r\n\r\n" + partial
		}
		// A chunked body whose second chunk size is garbage: the
		// connection stays open and the client waits for the answer.
		badChunk := func(method, host, path, ct string) string {
			return head(method, host, path, ct) + fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\nzz\r\n", len(partial), partial)
		}
		const closed = 0           // no answer: the connection was closed
		const timeoutOrClosed = -1 // 504 Timeout, or closed
		const proxyGaveUp = -2     // timeoutOrClosed, or the aggregator proxy's 503 for a cancelled forward
		for _, tc := range []struct {
			name, host string
			tls        bool
			req        string
			halfClose  bool
			want       int
			// msg is what the answer says; for a hang-up, what the
			// answer of a server that read the cut body says, with
			// status cutCode.
			msg     string
			cutCode int
		}{
			{"hang-up: create, directly", aggHost, true, hangUp("POST", aggHost, coll, "application/json"), true, timeoutOrClosed,
				"read the request body: unexpected EOF", 400},
			{"hang-up: patch, directly", aggHost, true, hangUp("PATCH", aggHost, obj, "application/merge-patch+json"), true, timeoutOrClosed,
				"read the request body: unexpected EOF", 400},
			{"hang-up: create, through kube-apiserver", kubeHost, true, hangUp("POST", kubeHost, coll, "application/json"), true, proxyGaveUp,
				"error trying to reach service: unexpected EOF", 503},
			{"hang-up: kube-apiserver's own ConfigMaps (reference)", kubeHost, true, hangUp("POST", kubeHost, cms, "application/json"), true,
				timeoutOrClosed, `"message":"unexpected EOF"`, 500},
			{"hang-up: MCP", mcpHost, false, hangUp("POST", mcpHost, "/mcp", "application/json"), true, 400, "failed to read body", 0},
			{"bad chunk: create, directly", aggHost, true, badChunk("POST", aggHost, coll, "application/json"), false,
				400, "read the request body: invalid byte in chunk length", 0},
			{"bad chunk: patch, directly", aggHost, true, badChunk("PATCH", aggHost, obj, "application/merge-patch+json"), false,
				400, "read the request body: invalid byte in chunk length", 0},
			// kube-apiserver's proxy fails reading the body it forwards.
			{"bad chunk: create, through kube-apiserver", kubeHost, true, badChunk("POST", kubeHost, coll, "application/json"), false,
				503, "error trying to reach service: invalid byte in chunk length", 0},
			{"bad chunk: kube-apiserver's own ConfigMaps (reference)", kubeHost, true, badChunk("POST", kubeHost, cms, "application/json"), false,
				500, "invalid byte in chunk length", 0},
			{"bad chunk: MCP", mcpHost, false, badChunk("POST", mcpHost, "/mcp", "application/json"), false,
				400, "failed to read body: invalid byte in chunk length", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, raw := hostileRaw(t, tc.host, tc.tls, tc.req, tc.halfClose)
				if tc.want == timeoutOrClosed || tc.want == proxyGaveUp {
					timedOut := code == http.StatusGatewayTimeout && strings.Contains(raw, "Timeout: request did not complete within the allotted timeout")
					proxyCancelled := tc.want == proxyGaveUp && code == http.StatusServiceUnavailable &&
						strings.Contains(raw, "error trying to reach service: context canceled")
					readCut := code == tc.cutCode && strings.Contains(raw, tc.msg)
					if code != closed && !timedOut && !proxyCancelled && !readCut {
						want := fmt.Sprintf("a 504 Timeout, the connection closed, or %d with %q", tc.cutCode, tc.msg)
						if tc.want == proxyGaveUp {
							want += ", or kube-apiserver's 503 for the cancelled forward"
						}
						t.Errorf("HTTP %d, want %s: %.600s", code, want, raw)
					}
					return
				}
				if code != tc.want || !strings.Contains(raw, tc.msg) {
					t.Errorf("HTTP %d, want %d with %q: %.600s", code, tc.want, tc.msg, raw)
				}
			})
		}
	})

	t.Logf("barrage done after %s", time.Since(start).Round(time.Second))

	// The process survived, and so did everything it serves.
	if exited, err := s.op.Exited(); exited {
		t.Fatalf("coder-k8s exited during the barrage: %v\n%s", err, s.op.LogTail(60))
	}
	for _, u := range []string{s.op.Health + "/healthz", s.op.Health + "/readyz", s.op.Aggregated + "/healthz", s.op.Aggregated + "/readyz",
		s.op.MCP + "/healthz", s.op.MCP + "/readyz"} {
		s.op.WaitOK(t, u)
	}
	if r := hostileDo(t, kube, http.MethodGet, kubeURL+obj, token, nil, nil); r.code != http.StatusOK || !strings.Contains(string(r.body), ws) {
		t.Errorf("GET %s through kube-apiserver after the barrage: %d %s", obj, r.code, r.snippet())
	}
	sess, err := mcpclient.Connect(ctx, s.op.MCP+"/mcp", mcpclient.Options{Token: token})
	if err != nil {
		t.Fatalf("MCP connect after the barrage: %v", err)
	}
	defer sess.Close()
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "list_workspaces", Arguments: map[string]any{"namespace": s.ns}})
	if err != nil || res.IsError || !strings.Contains(e2eMCPText(res), ws) {
		t.Errorf("list_workspaces after the barrage: %v %+v", err, res)
	}
	log, err := os.ReadFile(s.op.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	// Crashes and recovered panics; k8s.io/apiserver's deliberate
	// http.ErrAbortHandler ("timeout or abort while handling") is neither.
	for _, bad := range []string{"apiserver panic'd", "http: panic serving", "Observed a panic", "fatal error:", "\npanic: "} {
		if i := bytes.Index(log, []byte(bad)); i >= 0 {
			t.Errorf("operator log mentions %q:\n%s", bad, log[max(0, i-500):min(len(log), i+2000)])
		}
	}
	t.Logf("total %s", time.Since(start).Round(time.Second))
}

// hostileCase is one request to the coderworkspaces resource and what a
// client must see.
type hostileCase struct {
	name   string
	method string
	// path is "" for the collection, "obj" for the target workspace, or
	// "obj?query" / "?query"; templates selects codertemplates instead.
	path        string
	templates   bool
	contentType string
	body        []byte
	extra       map[string]string
	// want is the status code; reason and msg, when set, must be in the
	// Status object the server returns.
	want   int
	reason metav1.StatusReason
	msg    string
}

func (tc hostileCase) headers() map[string]string {
	h := map[string]string{}
	if tc.contentType != "" {
		h["Content-Type"] = tc.contentType
	}
	for k, v := range tc.extra {
		h[k] = v
	}
	return h
}

func (tc hostileCase) check(t *testing.T, r hostileResponse) {
	t.Helper()
	if r.code != tc.want {
		t.Fatalf("%s: HTTP %d, want %d: %s", tc.name, r.code, tc.want, r.snippet())
	}
	if tc.reason == "" {
		if !strings.Contains(string(r.body), tc.msg) {
			t.Fatalf("%s: answer does not contain %q: %s", tc.name, tc.msg, r.snippet())
		}
		return
	}
	var st metav1.Status
	if err := json.Unmarshal(r.body, &st); err != nil || st.Kind != "Status" {
		t.Fatalf("%s: body is not a Status (%v): %s", tc.name, err, r.snippet())
	}
	if st.Code != int32(tc.want) || (tc.reason != "" && st.Reason != tc.reason) || !strings.Contains(st.Message, tc.msg) {
		t.Fatalf("%s: Status code %d reason %q message %q; want %d %q containing %q", tc.name, st.Code, st.Reason, st.Message, tc.want, tc.reason, tc.msg)
	}
}

func hostileAggregatedCases(ws string) []hostileCase {
	const (
		jsonCT  = "application/json"
		yamlCT  = "application/yaml"
		mergeCT = "application/merge-patch+json"
		jpCT    = "application/json-patch+json"
		smpCT   = "application/strategic-merge-patch+json"
		applyCT = "application/apply-patch+yaml"
	)
	newWS := func(name, extra string) string {
		return `{"apiVersion":"aggregation.coder.com/v1alpha1","kind":"CoderWorkspace","metadata":{"name":"` + name +
			`"},"spec":{"templateName":"hostile","running":false` + extra + `}}`
	}
	valid := newWS("coder.nobody.hostile-new", "")
	newTpl := func(files string) string {
		return `{"apiVersion":"aggregation.coder.com/v1alpha1","kind":"CoderTemplate","metadata":{"name":"coder.evil"},"spec":{"files":{` + files + `}}}`
	}
	manyFiles := `"main.tf":""`
	for i := range 1000 {
		manyFiles += fmt.Sprintf(`,"f%04d.txt":""`, i)
	}
	deepJSON := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	deepYAML := strings.Repeat("- ", 50_000) + "x\n"
	bigAnnotation := `{"metadata":{"annotations":{"a":"` + strings.Repeat("x", hostileMaxBody) + `"}}}`
	aliasBomb := "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
	for i, prev := 'b', 'a'; i <= 'i'; i, prev = i+1, i {
		aliasBomb += fmt.Sprintf("%c: &%c [*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c,*%c]\n", i, i, prev, prev, prev, prev, prev, prev, prev, prev, prev)
	}
	var manyOps bytes.Buffer
	manyOps.WriteString("[")
	for i := range 10_001 {
		if i > 0 {
			manyOps.WriteString(",")
		}
		manyOps.WriteString(`{"op":"test","path":"/kind","value":"CoderWorkspace"}`)
	}
	manyOps.WriteString("]")
	// Each copy doubles the annotations: 40 doublings of 1 KiB.
	copyBomb := `[{"op":"add","path":"/metadata/annotations","value":{"a":"` + strings.Repeat("x", 1024) + `"}}`
	for i := range 40 {
		copyBomb += fmt.Sprintf(`,{"op":"copy","from":"/metadata/annotations","path":"/metadata/annotations/k%d"}`, i)
	}
	copyBomb += "]"

	const (
		unparsable  = "the object provided is unrecognized (must be of type CoderWorkspace)"
		tooDeepJSON = "json parse error: invalid character '[' exceeded max depth"
		tooLarge    = "Request entity too large: limit is 3145728"
		notPatch    = "415: Unsupported Media Type"
	)
	bad, invalid := metav1.StatusReasonBadRequest, metav1.StatusReasonInvalid
	return []hostileCase{
		// create
		{name: "create: malformed JSON", method: http.MethodPost, contentType: jsonCT, body: []byte(`{"apiVersion":`),
			want: 400, reason: bad, msg: unparsable + ": couldn't get version/kind; json parse error: unexpected end of JSON input"},
		{name: "create: truncated JSON", method: http.MethodPost, contentType: jsonCT, body: []byte(valid[:len(valid)/2]),
			want: 400, reason: bad, msg: "unexpected end of JSON input"},
		{name: "create: empty body", method: http.MethodPost, contentType: jsonCT, want: 400, reason: bad, msg: "unexpected end of JSON input (<empty>)"},
		{name: "create: null", method: http.MethodPost, contentType: jsonCT, body: []byte("null"),
			want: 422, reason: invalid, msg: `metadata.name: Invalid value: "": a workspace name is`},
		{name: "create: malformed YAML", method: http.MethodPost, contentType: yamlCT, body: []byte("apiVersion: [\nkind: {"),
			want: 400, reason: bad, msg: unparsable + ": yaml: line 2: did not find expected node content"},
		{name: "create: YAML alias bomb", method: http.MethodPost, contentType: yamlCT, body: []byte(aliasBomb),
			want: 400, reason: bad, msg: "yaml: document contains excessive aliasing"},
		{name: "create: deeply nested YAML", method: http.MethodPost, contentType: yamlCT, body: []byte(deepYAML),
			want: 400, reason: bad, msg: "yaml: exceeded max depth of 10000"},
		{name: "create: deeply nested JSON", method: http.MethodPost, contentType: jsonCT,
			body: []byte(newWS("coder.nobody.deep", `,"parameters":`+deepJSON(1_000_000))), want: 400, reason: bad, msg: tooDeepJSON},
		{name: "create: body over the limit", method: http.MethodPost, contentType: jsonCT, body: []byte(bigAnnotation),
			want: 413, reason: metav1.StatusReasonRequestEntityTooLarge, msg: tooLarge},
		{name: "create: text/plain", method: http.MethodPost, contentType: "text/plain", body: []byte(valid),
			want: 415, reason: metav1.StatusReasonUnsupportedMediaType, msg: "the body of the request was in an unknown format"},
		// Decoding replaces invalid UTF-8; the name is then not a Coder name.
		{name: "create: invalid UTF-8", method: http.MethodPost, contentType: jsonCT, body: []byte(newWS("coder.nobody.\xff\xfe", "")),
			want: 422, reason: invalid, msg: "is not a valid Coder name"},
		{name: "create: wrong kind", method: http.MethodPost, contentType: jsonCT,
			body: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}`), want: 400, reason: bad, msg: `Pod in version "v1" cannot be handled as a CoderWorkspace`},
		{name: "create: unknown field, strict", path: "?fieldValidation=Strict", method: http.MethodPost, contentType: jsonCT,
			body: []byte(newWS("coder.nobody.strict", `,"evil":true`)), want: 400, reason: bad, msg: `strict decoding error: unknown field "spec.evil"`},
		{name: "create: duplicate field, strict", path: "?fieldValidation=Strict", method: http.MethodPost, contentType: jsonCT,
			body: []byte(newWS("coder.nobody.dup", `,"running":true`)), want: 400, reason: bad, msg: `strict decoding error: duplicate field "spec.running"`},
		// update
		{name: "update: malformed JSON", path: "obj", method: http.MethodPut, contentType: jsonCT, body: []byte(`{"kind":"CoderWorkspace",`),
			want: 400, reason: bad, msg: "unexpected end of JSON input"},
		{name: "update: name differs from the URL", path: "obj", method: http.MethodPut, contentType: jsonCT, body: []byte(newWS("coder.nobody.other", "")),
			want: 400, reason: bad, msg: "does not match the name on the URL"},
		{name: "update: deeply nested JSON", path: "obj", method: http.MethodPut, contentType: jsonCT,
			body: []byte(newWS(ws, `,"parameters":`+deepJSON(1_000_000))), want: 400, reason: bad, msg: tooDeepJSON},
		{name: "update: body over the limit", path: "obj", method: http.MethodPut, contentType: jsonCT, body: []byte(bigAnnotation),
			want: 413, reason: metav1.StatusReasonRequestEntityTooLarge, msg: tooLarge},
		// patch
		{name: "patch: unsupported patch type", path: "obj", method: http.MethodPatch, contentType: "application/x-evil-patch", body: []byte(`{}`),
			want: 415, reason: metav1.StatusReasonUnsupportedMediaType, msg: notPatch},
		{name: "patch: plain JSON is not a patch type", path: "obj", method: http.MethodPatch, contentType: jsonCT, body: []byte(`{}`),
			want: 415, reason: metav1.StatusReasonUnsupportedMediaType, msg: notPatch},
		{name: "patch: malformed merge patch", path: "obj", method: http.MethodPatch, contentType: mergeCT, body: []byte(`{"spec":`),
			want: 400, reason: bad, msg: "error decoding patch: unexpected end of JSON input"},
		{name: "patch: merge patch that is an array", path: "obj", method: http.MethodPatch, contentType: mergeCT, body: []byte(`[1,2]`),
			want: 400, reason: bad, msg: "error decoding patch: json: cannot unmarshal array"},
		{name: "patch: JSON patch that is an object", path: "obj", method: http.MethodPatch, contentType: jpCT, body: []byte(`{"op":"add"}`),
			want: 400, reason: bad, msg: "error decoding patch: json: cannot unmarshal object"},
		{name: "patch: JSON patch with an unknown op", path: "obj", method: http.MethodPatch, contentType: jpCT,
			body: []byte(`[{"op":"evil","path":"/spec"}]`), want: 422, reason: invalid, msg: "the server rejected our request due to an error in our request"},
		{name: "patch: JSON patch over 10000 operations", path: "obj", method: http.MethodPatch, contentType: jpCT, body: manyOps.Bytes(),
			want: 413, reason: metav1.StatusReasonRequestEntityTooLarge, msg: "The allowed maximum operations in a JSON patch is 10000, got 10001"},
		// Stopped by JSONPatchMaxCopyBytes; k8s.io/apiserver keeps only a
		// generic message.
		{name: "patch: JSON patch copy bomb", path: "obj", method: http.MethodPatch, contentType: jpCT, body: []byte(copyBomb),
			want: 422, reason: invalid, msg: "the server rejected our request due to an error in our request"},
		{name: "patch: deeply nested merge patch", path: "obj", method: http.MethodPatch, contentType: mergeCT,
			body: []byte(`{"spec":{"parameters":` + deepJSON(1_000_000) + `}}`), want: 400, reason: bad, msg: "error decoding patch: invalid character '[' exceeded max depth"},
		{name: "patch: deeply nested strategic merge patch", path: "obj", method: http.MethodPatch, contentType: smpCT,
			body: []byte(`{"spec":{"parameters":` + deepJSON(1_000_000) + `}}`), want: 400, reason: bad, msg: "invalid character '[' exceeded max depth"},
		{name: "patch: strategic merge patch with invalid UTF-8", path: "obj", method: http.MethodPatch, contentType: smpCT,
			body: []byte("{\"spec\":{\"autostartSchedule\":\"\xff\xfe\"}}"), want: 422, reason: invalid, msg: "spec.autostartSchedule: Invalid value"},
		{name: "patch: patch over the limit", path: "obj", method: http.MethodPatch, contentType: mergeCT, body: []byte(bigAnnotation),
			want: 413, reason: metav1.StatusReasonRequestEntityTooLarge, msg: tooLarge},
		{name: "apply: no field manager", path: "obj", method: http.MethodPatch, contentType: applyCT, body: []byte(newWS(ws, "")),
			want: 422, reason: invalid, msg: "fieldManager: Required value: is required for apply patch"},
		{name: "apply: malformed YAML", path: "obj?fieldManager=hostile", method: http.MethodPatch, contentType: applyCT,
			body: []byte("apiVersion: [\n"), want: 400, reason: bad, msg: "error decoding YAML: error converting YAML to JSON: yaml: line 1"},
		{name: "apply: deeply nested YAML", path: "obj?fieldManager=hostile", method: http.MethodPatch, contentType: applyCT,
			body: []byte(deepYAML), want: 400, reason: bad, msg: "yaml: exceeded max depth of 10000"},
		{name: "apply: YAML alias bomb", path: "obj?fieldManager=hostile", method: http.MethodPatch, contentType: applyCT,
			body: []byte(aliasBomb), want: 400, reason: bad, msg: "yaml: document contains excessive aliasing"},
		// template sources (spec.files) breaking the archive rules
		{name: "template: path traversal", templates: true, method: http.MethodPost, contentType: jsonCT,
			body: []byte(newTpl(`"main.tf":"","../../etc/cron.d/evil":"x"`)), want: 422, reason: invalid, msg: `spec.files[../../etc/cron.d/evil]`},
		{name: "template: absolute path", templates: true, method: http.MethodPost, contentType: jsonCT,
			body: []byte(newTpl(`"main.tf":"","/etc/passwd":"x"`)), want: 422, reason: invalid, msg: `spec.files[/etc/passwd]`},
		{name: "template: too many files", templates: true, method: http.MethodPost, contentType: jsonCT,
			body: []byte(newTpl(manyFiles)), want: 422, reason: invalid, msg: "spec.files: Too many: 1001: must have at most 1000 items"},
		{name: "template: file over the limit", templates: true, method: http.MethodPost, contentType: jsonCT,
			body: []byte(newTpl(`"main.tf":"` + strings.Repeat("x", 1<<20+1) + `"`)), want: 422, reason: invalid, msg: "spec.files[main.tf]: Too long"},
		// list and watch
		{name: "list: malformed label selector", path: "?labelSelector=" + url.QueryEscape("a in ("), method: http.MethodGet,
			want: 400, reason: bad, msg: "unable to parse requirement"},
		{name: "list: unsupported field selector", path: "?fieldSelector=spec.evil%3Dx", method: http.MethodGet,
			want: 400, reason: bad, msg: `field label "spec.evil" is not supported for CoderWorkspace; supported: [metadata.name`},
		{name: "watch: malformed resourceVersion", path: "?watch=1&resourceVersion=evil", method: http.MethodGet,
			want: 400, reason: bad, msg: `invalid resourceVersion: "evil" is not a resourceVersion of this API server`},
		{name: "list: garbage limit", path: "?limit=-5x", method: http.MethodGet, want: 400, reason: bad, msg: `parsing "-5x": invalid syntax`},
		// headers: Go's HTTP server answers before any handler.
		{name: "huge header", path: "obj", method: http.MethodGet, extra: map[string]string{"X-Evil": strings.Repeat("x", 2<<20)},
			want: 431, msg: "Request Header Fields Too Large"},
	}
}

// hostileMCPCase is one request to /mcp and what a client must see: an
// HTTP status, and for JSON-RPC errors the error code, or for a tool call
// a result with isError; msg must be in the message or text.
type hostileMCPCase struct {
	name    string
	method  string
	headers map[string]string
	body    []byte
	want    int
	rpcErr  bool
	rpcCode int64
	toolErr bool
	// batch: the answer is a JSON array of this many results.
	batch int
	msg   string
}

func (tc hostileMCPCase) check(t *testing.T, r hostileResponse) {
	t.Helper()
	if r.code != tc.want {
		t.Fatalf("HTTP %d, want %d: %s", r.code, tc.want, r.snippet())
	}
	if tc.batch > 0 {
		var resps []struct {
			JSONRPC string          `json:"jsonrpc"`
			Result  json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(r.body, &resps); err != nil || len(resps) != tc.batch {
			t.Fatalf("want a JSON array of %d responses (%v): %s", tc.batch, err, r.snippet())
		}
		for _, resp := range resps {
			if resp.JSONRPC != "2.0" || len(resp.Result) == 0 {
				t.Fatalf("want results only: %s", r.snippet())
			}
		}
		return
	}
	if !tc.rpcErr && !tc.toolErr {
		if !strings.Contains(string(r.body), tc.msg) {
			t.Fatalf("body does not contain %q: %s", tc.msg, r.snippet())
		}
		return
	}
	var resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(r.body, &resp); err != nil || resp.JSONRPC != "2.0" {
		t.Fatalf("not a JSON-RPC response (%v): %s", err, r.snippet())
	}
	if tc.rpcErr {
		if resp.Error == nil || resp.Error.Code != tc.rpcCode || !strings.Contains(resp.Error.Message, tc.msg) {
			t.Fatalf("want JSON-RPC error %d with %q: %s", tc.rpcCode, tc.msg, r.snippet())
		}
		return
	}
	if resp.Result == nil || !resp.Result.IsError || len(resp.Result.Content) == 0 || !strings.Contains(resp.Result.Content[0].Text, tc.msg) {
		t.Fatalf("want a tool result with isError and %q: %s", tc.msg, r.snippet())
	}
}

func hostileMCPCases() []hostileMCPCase {
	call := func(params string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":` + params + `}`)
	}
	deep := strings.Repeat("[", 400_000) + strings.Repeat("]", 400_000)
	return []hostileMCPCase{
		{name: "malformed JSON", body: []byte(`{"jsonrpc":"2.0",`), want: 400, msg: "malformed payload: unmarshaling jsonrpc message: unexpected EOF"},
		{name: "empty body", want: 400, msg: "POST requires a non-empty body"},
		{name: "null", body: []byte("null"), want: 400, msg: "malformed payload: empty batch"},
		{name: "a number", body: []byte("42"), want: 400, msg: "malformed payload: unmarshaling jsonrpc message"},
		{name: "wrong jsonrpc version", body: []byte(`{"jsonrpc":"1.0","id":1,"method":"tools/list"}`),
			want: 400, msg: `malformed payload: invalid message version tag "1.0"; expected "2.0"`},
		{name: "no jsonrpc version", body: []byte(`{"id":1,"method":"tools/list"}`),
			want: 400, msg: `malformed payload: invalid message version tag ""; expected "2.0"`},
		// Protocol 2025-03-26 (assumed without the header) has batches.
		{name: "batch", body: []byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/list"},{"jsonrpc":"2.0","id":2,"method":"ping"}]`), want: 200, batch: 2},
		{name: "batch, protocol 2025-06-18", headers: map[string]string{"Mcp-Protocol-Version": "2025-06-18"},
			body: []byte(`[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]`), want: 400, msg: "JSON-RPC batching is not supported in 2025-06-18 and later"},
		{name: "empty batch", body: []byte(`[]`), want: 400, msg: "malformed payload: empty batch"},
		{name: "unknown method", body: []byte(`{"jsonrpc":"2.0","id":1,"method":"evil/method"}`), want: 400, msg: `JSON RPC not handled: "evil/method" unsupported`},
		{name: "unknown notification", body: []byte(`{"jsonrpc":"2.0","method":"notifications/evil"}`),
			want: 400, msg: `JSON RPC not handled: "notifications/evil" unsupported`},
		{name: "id is an object", body: []byte(`{"jsonrpc":"2.0","id":{},"method":"tools/list"}`), want: 400, msg: "malformed payload: parse error: invalid ID type"},
		{name: "tools/call params a string", body: call(`"list_workspaces"`), want: 200, rpcErr: true, rpcCode: -32602, msg: "invalid params"},
		{name: "tools/call name a number", body: call(`{"name":5}`), want: 200, rpcErr: true, rpcCode: -32602, msg: "invalid params"},
		{name: "tools/call unknown tool", body: call(`{"name":"evil","arguments":{}}`), want: 200, toolErr: true, msg: `unknown tool "evil"`},
		{name: "tools/call wrong argument type", body: call(`{"name":"list_workspaces","arguments":{"namespace":5}}`),
			want: 200, toolErr: true, msg: "The arguments must match this JSON schema"},
		{name: "tools/call arguments not an object", body: call(`{"name":"list_workspaces","arguments":[1]}`),
			want: 200, toolErr: true, msg: "The arguments must match this JSON schema"},
		{name: "tools/call invalid UTF-8", body: call("{\"name\":\"get_workspace\",\"arguments\":{\"namespace\":\"\xff\",\"name\":\"\xfe\"}}"),
			want: 200, toolErr: true, msg: "not found"},
		{name: "tools/call deeply nested arguments", body: call(`{"name":"list_workspaces","arguments":{"namespace":` + deep + `}}`),
			want: 400, msg: "malformed payload: unmarshaling jsonrpc message: json: exceeded maximum nesting depth"},
		// The go-sdk answers with error code 0 here (not -32602).
		{name: "initialize with a wrong protocol version type", body: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":5}}`),
			want: 200, rpcErr: true, rpcCode: 0, msg: "cannot unmarshal"},
		{name: "body over the limit", body: call(`{"name":"list_workspaces","arguments":{"namespace":"` + strings.Repeat("x", hostileMCPMaxBody) + `"}}`),
			want: 413, msg: "request body exceeds 1048576 bytes"},
		{name: "text/plain", headers: map[string]string{"Content-Type": "text/plain"}, body: call(`{"name":"health"}`),
			want: 415, msg: "Content-Type must be 'application/json'"},
		{name: "no Accept", headers: map[string]string{"Accept": ""}, body: call(`{"name":"health"}`),
			want: 400, msg: "Accept must contain both 'application/json' and 'text/event-stream'"},
		{name: "unknown protocol version header", headers: map[string]string{"Mcp-Protocol-Version": "1999-01-01"}, body: call(`{"name":"health"}`),
			want: 400, msg: "Unsupported protocol version"},
		{name: "GET", method: http.MethodGet, want: 405, msg: "Method Not Allowed"},
		{name: "huge header", headers: map[string]string{"X-Evil": strings.Repeat("x", 2<<20)}, body: call(`{"name":"health"}`),
			want: 431, msg: "Request Header Fields Too Large"},
	}
}

// hostileRaw writes req on a new connection, closing the sending side
// after it when halfClose is set, and returns the answer's status line
// and body, or 0 when the server closed the connection without one.
func hostileRaw(t *testing.T, host string, useTLS bool, req string, halfClose bool) (int, string) {
	t.Helper()
	d := &net.Dialer{Timeout: 10 * time.Second}
	var conn net.Conn
	var err error
	if useTLS {
		conn, err = tls.DialWithDialer(d, "tcp", host, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // not under test
	} else {
		conn, err = d.Dial("tcp", host)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return 0, "" // closed without an answer
	}
	if err != nil {
		t.Fatalf("no HTTP answer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, resp.Status + "\n" + string(body)
}

type hostileResponse struct {
	code  int
	ctype string
	body  []byte
}

func (r hostileResponse) snippet() string {
	return fmt.Sprintf("%s %.600s", r.ctype, r.body)
}

// hostileDo sends one request; a transport error fails the test (a
// crashed or hung server shows up here).
func hostileDo(t *testing.T, c *http.Client, method, u, token string, headers map[string]string, body []byte) hostileResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %.200s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatalf("%s %.200s: read the answer: %v", method, u, err)
	}
	return hostileResponse{code: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: b}
}

// hostileKubeClient talks HTTP/1.1 to kube-apiserver, verifying it with
// the stack's CA; requests carry a bearer token of their own.
func hostileKubeClient(t *testing.T, s *aggStack) *http.Client {
	pool := x509.NewCertPool()
	if len(s.k.Config.CAData) > 0 {
		pool.AppendCertsFromPEM(s.k.Config.CAData)
	} else if s.k.Config.CAFile != "" {
		pem, err := os.ReadFile(s.k.Config.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
	}
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{},
	}}
}
