// Package operatoraccess gets and keeps the operator's access to a coderd
// through the Coder API (never its database): first-user setup on a fresh
// coderd, a dedicated operator user and token stored in a Secret,
// validation and rotation of that token, and its revocation when access is
// disabled or the control plane is deleted.
package operatoraccess

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/metrics"
)

// Result is what the control plane reconciler writes into status.
type Result struct {
	// Ready is the OperatorAccessReady condition's status; Reason and
	// Message explain it.
	Ready           bool
	Reason, Message string
	// Unverified means coderd could not be asked: the token in
	// TokenSecretRef was valid at the last check and stays in use
	// (OperatorAccessReady Unknown).
	Unverified bool
	// TokenSecretRef selects the operator's token (nil unless Ready or
	// Unverified).
	TokenSecretRef *coderv1alpha1.SecretKeyReference
	// User is the Coder user the operator acts as.
	User string
	// AdminCredentialsSecret names the Secret with the first user's email
	// and password, when the operator created the first user.
	AdminCredentialsSecret string
	// FirstUser is true when coderd is known to have its first user
	// (set by ReconcileAt with a Dial only): the operator holds access,
	// created that user, or coderd said it has one.
	FirstUser bool
	// CoderVersion is the version coderd reports ("" when unreachable).
	CoderVersion string
	// Entitlements reported by coderd (nil when it has no license API).
	Entitlements *coderv1alpha1.EntitlementsStatus
	// License is the LicenseApplied condition when spec.license is set.
	License *LicenseResult
	// RequeueAfter is when access should be checked again.
	RequeueAfter time.Duration
}

// LicenseResult reports the license upload.
type LicenseResult struct {
	Applied         bool
	Reason, Message string
}

// The Secrets holding tokens and first-user credentials, and events.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Manager performs the Coder API side of a CoderControlPlane.
type Manager struct {
	// Client reads and writes Secrets (it should not cache Secrets
	// cluster-wide; reads go through APIReader when set).
	Client    client.Client
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Timeout bounds each call to coderd.
	Timeout time.Duration
	// ValidateEvery bounds how often a valid token is re-checked with
	// coderd; reconciles in between reuse the last result.
	ValidateEvery time.Duration
	// RevokeReplacedAfter is how long a replaced operator token keeps
	// working after its successor is stored, so that every reader of the
	// token Secret (the aggregated API server of each replica, through
	// its informer) has switched and requests sent with the old token
	// have finished (DefaultRevokeReplacedAfter when 0).
	RevokeReplacedAfter time.Duration

	mu      sync.Mutex
	results map[types.UID]cacheEntry
}

const (
	// defaultValidateEvery is ValidateEvery when unset.
	defaultValidateEvery = 5 * time.Minute
	// retryUnreachable is how soon a coderd that did not answer, or
	// answered with an error, is asked again.
	retryUnreachable = 15 * time.Second
)

// apiError is the result of a Coder API call that failed in a way the
// operator did not expect: CoderAPIError with Coder's message and the
// HTTP status, retried after retryUnreachable.
func (m *Manager) apiError(res Result, action string, err error) Result {
	msg := fmt.Sprintf("%s: %s", action, coderapi.Message(err))
	if code := coderapi.StatusCode(err); code != 0 {
		msg = fmt.Sprintf("%s (HTTP %d)", msg, code)
	}
	return Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonCoderAPIError, Message: msg, RequeueAfter: retryUnreachable}
}

// getSecret reads a Secret, through APIReader when set; nil when it does
// not exist.
func (m *Manager) getSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	reader := m.APIReader
	if reader == nil {
		reader = m.Client
	}
	var s corev1.Secret
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read Secret %s/%s: %w", namespace, name, err)
	}
	return &s, nil
}

// event records an event on ccp, when the Manager has a Recorder.
func (m *Manager) event(ccp *coderv1alpha1.CoderControlPlane, typ, reason, msg string) {
	if m.Recorder != nil {
		m.Recorder.Eventf(ccp, nil, typ, reason, "OperatorAccess", "%s", msg)
	}
}

// target labels the metrics of the clients acting on ccp.
func (m *Manager) target(ccp *coderv1alpha1.CoderControlPlane) coderapi.Target {
	return coderapi.ForControlPlaneTarget(ccp.Namespace, ccp.Name, metrics.ComponentController)
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return coderapi.DefaultTimeout
}

func (m *Manager) validateEvery() time.Duration {
	if m.ValidateEvery > 0 {
		return m.ValidateEvery
	}
	return defaultValidateEvery
}

// The last good result per control plane, so that reconciles triggered by
// other changes (a Deployment's status) do not call coderd each time.
type cacheEntry struct {
	at            time.Time
	url           string
	secretVersion string
	generation    int64
	result        Result
}

func (m *Manager) cached(ccp *coderv1alpha1.CoderControlPlane, secret *corev1.Secret, coderURL string) (Result, bool) {
	if secret == nil {
		return Result{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.cache()[ccp.UID]
	if !ok || e.secretVersion != secret.ResourceVersion || e.generation != ccp.Generation || e.url != coderURL {
		return Result{}, false
	}
	left := m.validateEvery() - time.Since(e.at)
	if left <= 0 {
		return Result{}, false
	}
	if ids, after := pendingRevocation(secret); len(ids) > 0 {
		// Replaced tokens are revoked by a full pass, when they are due.
		due := time.Until(after)
		if due <= 0 {
			return Result{}, false
		}
		left = min(left, due)
	}
	r := e.result
	r.RequeueAfter = left
	return r, true
}

func (m *Manager) remember(ccp *coderv1alpha1.CoderControlPlane, secret *corev1.Secret, coderURL string, r Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cache()[ccp.UID] = cacheEntry{at: time.Now(), url: coderURL, secretVersion: secret.ResourceVersion, generation: ccp.Generation, result: r}
}

// Recheck makes the next Reconcile of ccp check its token with coderd
// instead of trusting the last check.
func (m *Manager) Recheck(ccp *coderv1alpha1.CoderControlPlane) { m.forget(ccp) }

func (m *Manager) forget(ccp *coderv1alpha1.CoderControlPlane) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cache(), ccp.UID)
}

func (m *Manager) cache() map[types.UID]cacheEntry {
	if m.results == nil {
		m.results = map[types.UID]cacheEntry{}
	}
	return m.results
}
