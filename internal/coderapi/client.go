// Package coderapi builds codersdk clients for the operator's components
// and classifies Coder API errors, so every component talks to coderd with
// the same timeouts and reads errors the same way.
package coderapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// DefaultTimeout bounds a single call to coderd when the caller has no
// configured timeout.
const DefaultTimeout = 30 * time.Second

// MaxParallel is how many requests one component sends one coderd at
// once when it reads many things (build parameters, template versions).
const MaxParallel = 8

// NewClient returns a client for coderd at u that authenticates with token
// (none when empty) and bounds every call by timeout. Its requests are
// counted and timed under target's labels (see internal/metrics) and
// logged with the logger of their context.
func NewClient(u *url.URL, token string, timeout time.Duration, target Target) *codersdk.Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// net/http keeps 2 idle connections per host by default: of
	// MaxParallel requests at once (twice that while a LIST and a poll
	// overlap) the rest would be closed after each request and dialled,
	// over TLS handshaken, again.
	tr.MaxIdleConnsPerHost = 2 * MaxParallel
	c := codersdk.New(u, codersdk.WithHTTPClient(&http.Client{
		Transport: newInstrumented(u, tr, timeout, target),
	}))
	if token != "" {
		c.SetSessionToken(token)
	}
	return c
}

// CloseIdle drops the idle keep-alive connections of a client that is
// done with (made for one pass, or replaced), which would otherwise stay
// open, each with two goroutines, until the transport's idle timeout.
// Requests still using the client finish normally.
func CloseIdle(c *codersdk.Client) {
	if c != nil && c.HTTPClient != nil {
		c.HTTPClient.CloseIdleConnections()
	}
}

// StatusCode returns the HTTP status of a Coder API error, or 0 when err
// did not come from a Coder API response (for example a network error).
func StatusCode(err error) int {
	var sdkErr *codersdk.Error
	if errors.As(err, &sdkErr) {
		return sdkErr.StatusCode()
	}
	return 0
}

// IsNotFound reports a 404 from coderd.
func IsNotFound(err error) bool { return StatusCode(err) == http.StatusNotFound }

// IsUnauthorized reports a 401 from coderd: the token is unknown, revoked
// or expired.
func IsUnauthorized(err error) bool { return StatusCode(err) == http.StatusUnauthorized }

// Message returns Coder's own message for err, with its detail when given.
func Message(err error) string {
	var sdkErr *codersdk.Error
	if errors.As(err, &sdkErr) {
		if sdkErr.Detail != "" {
			return sdkErr.Message + ": " + sdkErr.Detail
		}
		return sdkErr.Message
	}
	return err.Error()
}

// ErrAccessNotReady means a control plane has no usable operator access:
// it is disabled, or not established yet.
var ErrAccessNotReady = errors.New("operator access to the control plane is not ready")

// ForControlPlane returns a client that acts as the operator on ccp: its
// status URL and the token in the Secret its status references. secrets
// should be an uncached reader, so that Secrets are not cached
// cluster-wide. The error wraps ErrAccessNotReady when the control plane's
// access is disabled or not ready. component labels the client's metrics.
func ForControlPlane(ctx context.Context, secrets client.Reader, ccp *coderv1alpha1.CoderControlPlane, timeout time.Duration, component string) (*codersdk.Client, error) {
	if ccp.Spec.OperatorAccess.Disabled {
		return nil, fmt.Errorf("control plane %s/%s: operator access is disabled: %w", ccp.Namespace, ccp.Name, ErrAccessNotReady)
	}
	if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) ||
		ccp.Status.URL == "" || ccp.Status.OperatorTokenSecretRef == nil {
		return nil, fmt.Errorf("control plane %s/%s: %w", ccp.Namespace, ccp.Name, ErrAccessNotReady)
	}
	u, err := url.Parse(ccp.Status.URL)
	if err != nil {
		return nil, fmt.Errorf("control plane %s/%s: status.url %q: %w", ccp.Namespace, ccp.Name, ccp.Status.URL, err)
	}
	ref := ccp.Status.OperatorTokenSecretRef
	var secret corev1.Secret
	if err := secrets.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ref.Name}, &secret); err != nil {
		return nil, fmt.Errorf("control plane %s/%s: read operator token Secret %s: %w", ccp.Namespace, ccp.Name, ref.Name, err)
	}
	token := string(secret.Data[ref.Key])
	if token == "" {
		return nil, fmt.Errorf("control plane %s/%s: Secret %s has no key %q: %w", ccp.Namespace, ccp.Name, ref.Name, ref.Key, ErrAccessNotReady)
	}
	return NewClient(u, token, timeout, ForControlPlaneTarget(ccp.Namespace, ccp.Name, component)), nil
}
