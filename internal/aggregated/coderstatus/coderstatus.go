// Package coderstatus turns errors from calls to coderd into Kubernetes API
// statuses, so that kubectl shows the reason Kubernetes clients understand
// (NotFound, AlreadyExists, Invalid, ...) together with Coder's own message.
package coderstatus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/coder-k8s/internal/truncate"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// DefaultRetryAfterSeconds is the Retry-After sent with a 429 from coderd:
// codersdk.Error does not carry coderd's response headers.
const DefaultRetryAfterSeconds = 1

// maxMessage bounds Coder's message in a status: a proxy in front of
// coderd may answer with a whole HTML page, which codersdk keeps as the
// error's detail.
const maxMessage = 1024

// Target describes the Kubernetes object a call to coderd was made for,
// and the coderd it went to.
type Target struct {
	// Resource is the aggregated resource, for example
	// {Group: "aggregation.coder.com", Resource: "coderworkspaces"}.
	Resource schema.GroupResource
	// Kind is the object's kind (CoderWorkspace), used by Invalid
	// statuses. Empty falls back to Resource.Resource.
	Kind string
	// Name is the object's name; empty for list and collection calls.
	Name string
	// Fields maps the field names coderd uses in its validation errors
	// (JSON names such as "template_version_id") to field paths of the
	// Kubernetes object ("spec.templateVersion"). Coder fields missing
	// from the map are reported under their Coder name.
	Fields map[string]string
	// Create marks a create request: a 409 from coderd then always means
	// the name is taken (AlreadyExists).
	Create bool
	// CoderURL is the coderd the call went to, named in "unreachable"
	// messages.
	CoderURL string
	// ControlPlane is the CoderControlPlane ("namespace/name") whose
	// operator token made the call, named in 401/403 messages.
	ControlPlane string
	// StaticBackend marks a call made with the static backend's session
	// token (aggregated-apiserver mode) rather than a control plane's
	// operator token; it changes the 401/403 hint.
	StaticBackend bool
}

// Error returns err as a *apierrors.StatusError for the object tgt
// describes; nil stays nil. The mapping:
//
//   - a *apierrors.StatusError passes through unchanged;
//   - Coder 404 → NotFound; 409 → AlreadyExists on create or when Coder
//     says the object already exists, else Conflict;
//   - Coder 400/422 with validations → Invalid with one cause per
//     validation (field paths through tgt.Fields); without → BadRequest;
//   - Coder 401/403 → Forbidden, with a hint that the operator's access to
//     coderd was refused (or, for a "Premium feature" 403, that coderd does
//     not offer the feature);
//   - Coder 429 → TooManyRequests (Retry-After DefaultRetryAfterSeconds);
//   - Coder 5xx → ServiceUnavailable;
//   - other Coder statuses keep their code with the matching reason;
//   - no answer from coderd (network error, http client timeout, deadline
//     of the caller's context) → ServiceUnavailable "coderd at URL is
//     unreachable";
//   - the caller's context cancelled → Timeout (504), as k8s.io/apiserver
//     itself answers for a request whose context ended; callers that must
//     tell a cancellation apart check their context's Err first;
//   - anything else → InternalError.
//
// Every status for an answer from coderd carries Coder's own message
// (with its detail).
func Error(err error, tgt Target) error {
	if err == nil {
		return nil
	}
	var status *apierrors.StatusError
	if errors.As(err, &status) {
		return status
	}
	var sdkErr *codersdk.Error
	if errors.As(err, &sdkErr) {
		return fromCoder(sdkErr, tgt)
	}
	return fromTransport(err, tgt)
}

func fromCoder(sdkErr *codersdk.Error, tgt Target) *apierrors.StatusError {
	gr, name := tgt.Resource, tgt.Name
	msg := truncate.String(coderapi.Message(sdkErr), maxMessage)
	code := sdkErr.StatusCode()
	switch {
	case code == http.StatusNotFound:
		return withMessage(apierrors.NewNotFound(gr, name), msg)
	case code == http.StatusConflict:
		if tgt.Create || strings.Contains(strings.ToLower(msg), "already exists") {
			return withMessage(apierrors.NewAlreadyExists(gr, name), msg)
		}
		return apierrors.NewConflict(gr, name, errors.New(msg))
	case code == http.StatusBadRequest || code == http.StatusUnprocessableEntity:
		if len(sdkErr.Validations) > 0 {
			return invalid(sdkErr, msg, tgt)
		}
		st := apierrors.NewBadRequest(msg)
		st.ErrStatus.Details = details(tgt)
		return st
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return apierrors.NewForbidden(gr, name, errors.New(forbiddenHint(sdkErr, tgt)+": "+msg))
	case code == http.StatusTooManyRequests:
		st := apierrors.NewTooManyRequests("coderd is rate limiting requests: "+msg, DefaultRetryAfterSeconds)
		st.ErrStatus.Details = details(tgt)
		st.ErrStatus.Details.RetryAfterSeconds = DefaultRetryAfterSeconds
		return st
	case code >= 500:
		st := apierrors.NewServiceUnavailable(fmt.Sprintf("coderd%s answered %d: %s", at(tgt, sdkErr), code, msg))
		st.ErrStatus.Details = details(tgt)
		return st
	default:
		// Statuses coderd does not use for these APIs today (405, 410,
		// 412, ...): keep the code and the reason Kubernetes gives it.
		st := apierrors.NewGenericServerResponse(code, sdkErr.Method(), gr, name, msg, 0, false)
		st.ErrStatus.Message = fmt.Sprintf("coderd answered %d: %s", code, msg)
		return st
	}
}

// invalid builds an Invalid status from Coder's validations. Coder's
// message leads, because it often says more than the field details
// ("Validation failed." aside).
func invalid(sdkErr *codersdk.Error, msg string, tgt Target) *apierrors.StatusError {
	kind := tgt.Kind
	if kind == "" {
		kind = tgt.Resource.Resource
	}
	gk := schema.GroupKind{Group: tgt.Resource.Group, Kind: kind}
	var errs field.ErrorList
	for _, v := range sdkErr.Validations {
		path := v.Field
		if mapped, ok := tgt.Fields[v.Field]; ok && mapped != "" {
			path = mapped
		}
		// Coder does not send the rejected value; OmitValueType keeps
		// the cause from printing a misleading empty one.
		errs = append(errs, field.Invalid(field.NewPath(path), field.OmitValueType{}, v.Detail))
	}
	st := apierrors.NewInvalid(gk, tgt.Name, errs)
	st.ErrStatus.Message = fmt.Sprintf("%s %q is invalid: %s: %v", gk.String(), tgt.Name, strings.TrimSuffix(msg, "."), errs.ToAggregate())
	return st
}

func forbiddenHint(sdkErr *codersdk.Error, tgt Target) string {
	if sdkErr.StatusCode() == http.StatusForbidden {
		if _, ok := coderapi.FeatureUnavailable(sdkErr); ok {
			return "coderd does not offer this feature (it needs a Coder Premium license)"
		}
	}
	switch {
	case tgt.StaticBackend:
		return "coder-k8s's session token (aggregatedAPIServer.coder.staticBackend) was refused by coderd"
	case tgt.ControlPlane != "":
		return fmt.Sprintf("coder-k8s's operator access to control plane %s was refused by coderd (check the CoderControlPlane's OperatorAccessReady condition)", tgt.ControlPlane)
	default:
		return "coder-k8s's operator access to this control plane was refused by coderd (check the CoderControlPlane's OperatorAccessReady condition)"
	}
}

// fromTransport maps errors for which coderd gave no answer.
func fromTransport(err error, tgt Target) *apierrors.StatusError {
	timeout := isTimeout(err)
	var redirect *coderapi.RedirectError
	var tooLarge *coderapi.ResponseTooLargeError
	switch {
	case errors.As(err, &redirect) || errors.As(err, &tooLarge):
		// coderd answered, with nothing coder-k8s may use: the error says
		// what and why.
		st := apierrors.NewServiceUnavailable(fmt.Sprintf("coderd%s gave an unusable answer: %s", at(tgt, err), transportMessage(err)))
		st.ErrStatus.Details = details(tgt)
		return st
	case errors.Is(err, context.Canceled) && !timeout:
		return apierrors.NewTimeoutError(fmt.Sprintf("the request to coderd%s was cancelled before it answered", at(tgt, err)), 0)
	case timeout || isNetwork(err):
		st := apierrors.NewServiceUnavailable(fmt.Sprintf("coderd%s is unreachable: %s", at(tgt, err), transportMessage(err)))
		st.ErrStatus.Details = details(tgt)
		return st
	default:
		return apierrors.NewInternalError(err)
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isNetwork(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne)
}

// transportMessage drops the method and full request URL that *url.Error
// prepends: the message already names coderd, and the path adds noise.
func transportMessage(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}

// at names the coderd a call went to: tgt.CoderURL, else the scheme and
// host of the request in err (never its path or query).
func at(tgt Target, err error) string {
	if tgt.CoderURL != "" {
		return " at " + tgt.CoderURL
	}
	raw := ""
	var sdkErr *codersdk.Error
	var ue *url.Error
	switch {
	case errors.As(err, &sdkErr):
		raw = sdkErr.URL()
	case errors.As(err, &ue):
		raw = ue.URL
	}
	if u, perr := url.Parse(raw); perr == nil && u.Host != "" {
		return " at " + u.Scheme + "://" + u.Host
	}
	return ""
}

func details(tgt Target) *metav1.StatusDetails {
	kind := tgt.Kind
	if kind == "" {
		kind = tgt.Resource.Resource
	}
	return &metav1.StatusDetails{Group: tgt.Resource.Group, Kind: kind, Name: tgt.Name}
}

// withMessage appends Coder's message to a standard Kubernetes message,
// which clients and people recognise.
func withMessage(st *apierrors.StatusError, msg string) *apierrors.StatusError {
	if msg != "" {
		st.ErrStatus.Message += ": " + msg
	}
	return st
}
