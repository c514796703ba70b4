// Package operatoraccess gets and keeps the operator's access to a coderd
// through the Coder API (never its database): first-user setup on a fresh
// coderd, a dedicated operator user and token stored in a Secret,
// validation and rotation of that token, and its revocation when access is
// disabled or the control plane is deleted.
package operatoraccess

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
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

	mu      sync.Mutex
	results map[types.UID]cacheEntry
}
