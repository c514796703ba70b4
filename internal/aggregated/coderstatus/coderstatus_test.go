package coderstatus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/coder/coder-k8s/internal/aggregated/coderstatus"
	"github.com/coder/coder-k8s/internal/coderapi"
)

var workspaces = schema.GroupResource{Group: "aggregation.coder.com", Resource: "coderworkspaces"}

// answer is what the stand-in coderd writes for one path.
type answer struct {
	status      int
	contentType string
	body        string
}

// coderAnswers serves Coder-shaped error bodies (the exact messages coderd
// v2.30.0 writes where it has one) by path.
var coderAnswers = map[string]answer{
	"/not-found": {http.StatusNotFound, "", js(codersdk.Response{Message: "Resource not found or you do not have access to this resource"})},
	"/exists": {http.StatusConflict, "", js(codersdk.Response{
		Message:     `Workspace "ws" already exists.`,
		Validations: []codersdk.ValidationError{{Field: "name", Detail: "This value is already in use and should be unique."}},
	})},
	"/conflict": {http.StatusConflict, "", js(codersdk.Response{Message: "A build is already in progress for this workspace."})},
	"/validation": {http.StatusBadRequest, "", js(codersdk.Response{
		Message: "Validation failed.",
		Validations: []codersdk.ValidationError{
			{Field: "name", Detail: `Validation failed for tag "workspace_name" with value: "Bad Name"`},
			{Field: "ttl_ms", Detail: "ttl must be at least one minute"},
		},
	})},
	"/unprocessable": {http.StatusUnprocessableEntity, "", js(codersdk.Response{
		Message:     "Invalid parameters.",
		Validations: []codersdk.ValidationError{{Field: "rich_parameter_values", Detail: `parameter "region" is required`}},
	})},
	"/bad-request":  {http.StatusBadRequest, "", js(codersdk.Response{Message: "Invalid workspace transition.", Detail: `"fly" is not a transition`})},
	"/unauthorized": {http.StatusUnauthorized, "", js(codersdk.Response{Message: "You are signed out or your session has expired. Please sign in again to continue."})},
	"/forbidden":    {http.StatusForbidden, "", js(codersdk.Response{Message: "Forbidden."})},
	"/premium":      {http.StatusForbidden, "", js(codersdk.Response{Message: "Workspace Proxy is a Premium feature. Contact sales!"})},
	"/rate-limited": {http.StatusTooManyRequests, "", js(codersdk.Response{Message: "You've been rate limited for sending more than 512 requests in 1m0s."})},
	"/internal":     {http.StatusInternalServerError, "", js(codersdk.Response{Message: "Internal error fetching workspace.", Detail: "pq: too many connections"})},
	"/bad-gateway":  {http.StatusBadGateway, "text/html", "<html><body>" + strings.Repeat("upstream down ", 400) + "</body></html>"},
	"/deleted":      {http.StatusMethodNotAllowed, "", js(codersdk.Response{Message: `Workspace "ws" is deleted and cannot be updated.`})},
}

func js(r codersdk.Response) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// coderError asks the stand-in coderd for path and reads the answer the
// way codersdk does for every failed call.
func coderError(t *testing.T, path string) error {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := coderAnswers[r.URL.Path]
		if !ok {
			t.Errorf("unexpected path %s", r.URL.Path)
			a = answer{status: http.StatusNotFound, body: js(codersdk.Response{Message: "Route not found."})}
		}
		ct := a.contentType
		if ct == "" {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	}))
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	res, err := coderapi.NewClient(u, "token", 0, coderapi.Target{}).Request(t.Context(), http.MethodPost, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = codersdk.ReadBodyAsError(res)
	var sdkErr *codersdk.Error
	if !errors.As(err, &sdkErr) {
		t.Fatalf("ReadBodyAsError = %T %v, want a *codersdk.Error", err, err)
	}
	return err
}

func statusOf(t *testing.T, err error) metav1.Status {
	t.Helper()
	var st *apierrors.StatusError
	if !errors.As(err, &st) {
		t.Fatalf("Error returned %T %v, want a *apierrors.StatusError", err, err)
	}
	return st.ErrStatus
}

func wantStatus(t *testing.T, st metav1.Status, code int32, reason metav1.StatusReason, contains ...string) {
	t.Helper()
	if st.Code != code || st.Reason != reason {
		t.Errorf("status = %d %s (%q), want %d %s", st.Code, st.Reason, st.Message, code, reason)
	}
	for _, c := range contains {
		if !strings.Contains(st.Message, c) {
			t.Errorf("message %q does not contain %q", st.Message, c)
		}
	}
}

func TestCoderAnswers(t *testing.T) {
	base := coderstatus.Target{Resource: workspaces, Kind: "CoderWorkspace", Name: "ws"}

	t.Run("404 is NotFound", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/not-found"), base))
		wantStatus(t, st, 404, metav1.StatusReasonNotFound,
			`coderworkspaces.aggregation.coder.com "ws" not found`, "Resource not found or you do not have access")
		if st.Details == nil || st.Details.Name != "ws" || st.Details.Group != workspaces.Group {
			t.Errorf("details = %+v", st.Details)
		}
	})

	t.Run("409 saying it exists is AlreadyExists", func(t *testing.T) {
		err := coderstatus.Error(coderError(t, "/exists"), base)
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("got %v, want AlreadyExists", err)
		}
		wantStatus(t, statusOf(t, err), 409, metav1.StatusReasonAlreadyExists, `"ws" already exists`, `Workspace "ws" already exists.`)
	})

	t.Run("other 409 is Conflict, AlreadyExists on create", func(t *testing.T) {
		err := coderstatus.Error(coderError(t, "/conflict"), base)
		if !apierrors.IsConflict(err) {
			t.Fatalf("got %v, want Conflict", err)
		}
		wantStatus(t, statusOf(t, err), 409, metav1.StatusReasonConflict, "A build is already in progress")
		create := base
		create.Create = true
		if err := coderstatus.Error(coderError(t, "/conflict"), create); !apierrors.IsAlreadyExists(err) {
			t.Errorf("on create got %v, want AlreadyExists", err)
		}
	})

	t.Run("400 with validations is Invalid with mapped fields", func(t *testing.T) {
		opts := base
		opts.Fields = map[string]string{"name": "metadata.name"}
		err := coderstatus.Error(coderError(t, "/validation"), opts)
		if !apierrors.IsInvalid(err) {
			t.Fatalf("got %v, want Invalid", err)
		}
		st := statusOf(t, err)
		wantStatus(t, st, 422, metav1.StatusReasonInvalid,
			`CoderWorkspace.aggregation.coder.com "ws" is invalid: Validation failed:`,
			`metadata.name: Invalid value: Validation failed for tag "workspace_name"`,
			"ttl_ms: Invalid value: ttl must be at least one minute")
		if st.Details.Kind != "CoderWorkspace" || st.Details.Group != workspaces.Group || st.Details.Name != "ws" {
			t.Errorf("details = %+v", st.Details)
		}
		fields := map[string]string{}
		for _, c := range st.Details.Causes {
			if c.Type != metav1.CauseTypeFieldValueInvalid {
				t.Errorf("cause %+v has type %s", c, c.Type)
			}
			fields[c.Field] = c.Message
		}
		if len(fields) != 2 || fields["metadata.name"] == "" || fields["ttl_ms"] == "" {
			t.Errorf("causes = %+v, want metadata.name (mapped) and ttl_ms (unmapped)", st.Details.Causes)
		}
	})

	t.Run("422 with validations is Invalid", func(t *testing.T) {
		opts := base
		opts.Fields = map[string]string{"rich_parameter_values": "spec.parameters"}
		st := statusOf(t, coderstatus.Error(coderError(t, "/unprocessable"), opts))
		wantStatus(t, st, 422, metav1.StatusReasonInvalid, "Invalid parameters", `spec.parameters: Invalid value: parameter "region" is required`)
	})

	t.Run("kind falls back to the resource", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/validation"), coderstatus.Target{Resource: workspaces, Name: "ws"}))
		if st.Details.Kind != "coderworkspaces" {
			t.Errorf("kind = %q", st.Details.Kind)
		}
	})

	t.Run("400 without validations is BadRequest with Coder's message", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/bad-request"), base))
		wantStatus(t, st, 400, metav1.StatusReasonBadRequest)
		if want := `Invalid workspace transition.: "fly" is not a transition`; st.Message != want {
			t.Errorf("message = %q, want %q", st.Message, want)
		}
	})

	t.Run("401 and 403 are Forbidden with the access hint", func(t *testing.T) {
		for path, coderMsg := range map[string]string{
			"/unauthorized": "You are signed out or your session has expired.",
			"/forbidden":    "Forbidden.",
		} {
			err := coderstatus.Error(coderError(t, path), base)
			if !apierrors.IsForbidden(err) {
				t.Fatalf("%s: got %v, want Forbidden", path, err)
			}
			wantStatus(t, statusOf(t, err), 403, metav1.StatusReasonForbidden,
				`coderworkspaces.aggregation.coder.com "ws" is forbidden: `+
					"coder-k8s's operator access to this control plane was refused by coderd (check the CoderControlPlane's OperatorAccessReady condition): "+coderMsg)
		}
		named := base
		named.ControlPlane = "team-a/coder"
		wantStatus(t, statusOf(t, coderstatus.Error(coderError(t, "/unauthorized"), named)), 403, metav1.StatusReasonForbidden,
			"operator access to control plane team-a/coder was refused", "You are signed out")
		static := base
		static.StaticBackend = true
		wantStatus(t, statusOf(t, coderstatus.Error(coderError(t, "/forbidden"), static)), 403, metav1.StatusReasonForbidden,
			"session token (aggregatedAPIServer.coder.staticBackend) was refused by coderd: Forbidden.")
	})

	t.Run("403 for a Premium feature says so", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/premium"), base))
		wantStatus(t, st, 403, metav1.StatusReasonForbidden, "does not offer this feature", "Workspace Proxy is a Premium feature")
		if strings.Contains(st.Message, "OperatorAccessReady") {
			t.Errorf("a missing license is blamed on operator access: %q", st.Message)
		}
	})

	t.Run("429 is TooManyRequests with Retry-After", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/rate-limited"), base))
		wantStatus(t, st, 429, metav1.StatusReasonTooManyRequests, "You've been rate limited")
		if st.Details == nil || st.Details.RetryAfterSeconds != coderstatus.DefaultRetryAfterSeconds {
			t.Errorf("details = %+v, want RetryAfterSeconds %d", st.Details, coderstatus.DefaultRetryAfterSeconds)
		}
		if _, ok := apierrors.SuggestsClientDelay(coderstatus.Error(coderError(t, "/rate-limited"), base)); !ok {
			t.Errorf("clients are not told to wait")
		}
	})

	t.Run("5xx is ServiceUnavailable with Coder's message", func(t *testing.T) {
		opts := base
		opts.CoderURL = "https://coder.example.com"
		st := statusOf(t, coderstatus.Error(coderError(t, "/internal"), opts))
		wantStatus(t, st, 503, metav1.StatusReasonServiceUnavailable,
			"coderd at https://coder.example.com answered 500: Internal error fetching workspace.: pq: too many connections")
	})

	t.Run("a non-JSON 502 is ServiceUnavailable with a bounded message", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/bad-gateway"), base))
		wantStatus(t, st, 503, metav1.StatusReasonServiceUnavailable, "answered 502", "upstream down")
		if len(st.Message) > 1200 {
			t.Errorf("message is %d bytes long", len(st.Message))
		}
	})

	t.Run("other statuses keep their code", func(t *testing.T) {
		st := statusOf(t, coderstatus.Error(coderError(t, "/deleted"), base))
		wantStatus(t, st, 405, metav1.StatusReasonMethodNotAllowed, `Workspace "ws" is deleted and cannot be updated.`)
	})
}

func TestPassThrough(t *testing.T) {
	if err := coderstatus.Error(nil, coderstatus.Target{}); err != nil {
		t.Errorf("Error(nil) = %v", err)
	}
	in := apierrors.NewNotFound(workspaces, "x")
	wrapped := fmt.Errorf("list: %w", in)
	if out := coderstatus.Error(wrapped, coderstatus.Target{Resource: workspaces}); out != error(in) {
		t.Errorf("a wrapped StatusError came back as %#v", out)
	}
	err := coderstatus.Error(errors.New("decode body: unexpected EOF"), coderstatus.Target{Resource: workspaces})
	wantStatus(t, statusOf(t, err), 500, metav1.StatusReasonInternalError, "decode body: unexpected EOF")
}

func TestUnreachable(t *testing.T) {
	opts := coderstatus.Target{Resource: workspaces, Kind: "CoderWorkspace", Name: "ws"}

	t.Run("closed port", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		u := &url.URL{Scheme: "http", Host: l.Addr().String()}
		_ = l.Close()
		_, err = coderapi.NewClient(u, "token", 0, coderapi.Target{}).BuildInfo(t.Context())
		if err == nil {
			t.Fatal("BuildInfo on a closed port succeeded")
		}
		o := opts
		o.CoderURL = u.String()
		st := statusOf(t, coderstatus.Error(err, o))
		wantStatus(t, st, 503, metav1.StatusReasonServiceUnavailable, "coderd at "+u.String()+" is unreachable: ", "connection refused")
		if strings.Contains(st.Message, "/api/v2/buildinfo") {
			t.Errorf("message repeats the request URL: %q", st.Message)
		}
		// Without CoderURL the message names coderd from the request.
		wantStatus(t, statusOf(t, coderstatus.Error(err, opts)), 503, metav1.StatusReasonServiceUnavailable, "coderd at "+u.String()+" is unreachable: ", "connection refused")
	})

	hung := hungCoderd(t)

	t.Run("deadline of the caller", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err := coderapi.NewClient(hung, "token", time.Minute, coderapi.Target{}).BuildInfo(ctx)
		if err == nil {
			t.Fatal("BuildInfo on a hung coderd succeeded")
		}
		o := opts
		o.CoderURL = hung.String()
		wantStatus(t, statusOf(t, coderstatus.Error(err, o)), 503, metav1.StatusReasonServiceUnavailable, "coderd at "+hung.String()+" is unreachable: ", "deadline exceeded")
	})

	t.Run("client timeout", func(t *testing.T) {
		_, err := coderapi.NewClient(hung, "token", 100*time.Millisecond, coderapi.Target{}).BuildInfo(t.Context())
		if err == nil {
			t.Fatal("BuildInfo on a hung coderd succeeded")
		}
		wantStatus(t, statusOf(t, coderstatus.Error(err, opts)), 503, metav1.StatusReasonServiceUnavailable, "is unreachable: ", "Client.Timeout exceeded")
	})

	t.Run("cancelled by the caller", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := coderapi.NewClient(hung, "token", time.Minute, coderapi.Target{}).BuildInfo(ctx)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("BuildInfo = %v, want a cancellation", err)
		}
		err = coderstatus.Error(err, opts)
		if !apierrors.IsTimeout(err) {
			t.Errorf("got %v, want Timeout", err)
		}
		wantStatus(t, statusOf(t, err), 504, metav1.StatusReasonTimeout, "cancelled")
	})
}

// hungCoderd accepts requests and never answers them until the test ends.
func hungCoderd(t *testing.T) *url.URL {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestUnusableAnswer: a coderd that redirects, or answers more than
// coder-k8s reads, is not "unreachable"; the status says what it did.
func TestUnusableAnswer(t *testing.T) {
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the redirect was followed: %s %s", r.Method, r.URL)
	}))
	t.Cleanup(elsewhere.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+"/login", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	_, err := coderapi.NewClient(u, "token", 0, coderapi.Target{}).Workspaces(t.Context(), codersdk.WorkspaceFilter{})
	o := coderstatus.Target{Resource: workspaces, Kind: "CoderWorkspace", CoderURL: u.String()}
	wantStatus(t, statusOf(t, coderstatus.Error(err, o)), 503, metav1.StatusReasonServiceUnavailable,
		"coderd at "+u.String()+" gave an unusable answer: coderd answered GET /api/v2/workspaces with a redirect (307) to "+elsewhere.URL+"/login;",
		"configure coderd's final URL")
}
