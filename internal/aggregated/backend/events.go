package backend

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Warning events on a CoderControlPlane for what the aggregated API sees
// between the controller's access checks (one per
// controller.operatorAccessCheckInterval): kubectl then
// fails for the control plane's namespace, and `kubectl describe ccp`
// says why.
//
// The marker stands apart from the const block: controller-gen drops RBAC
// markers in the doc comment of a const declaration.
//
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reasons of the Warning events above.
const (
	// ReasonOperatorTokenRejected: coderd answered 401 to the operator
	// token; the controller replaces it when asked (recheck) or at its
	// next check.
	ReasonOperatorTokenRejected = "OperatorTokenRejected"
	// ReasonCoderdUnreachable: a request to coderd got no answer.
	ReasonCoderdUnreachable = coderv1alpha1.ReasonCoderdUnreachable
)

// problemEventInterval is the least time between two events of one reason
// for one control plane, however many requests fail.
const problemEventInterval = 5 * time.Minute

// recheckInterval is the least time between two access rechecks asked
// for one control plane: a burst of rejected requests asks once.
const recheckInterval = 30 * time.Second

// reasonRecheck keys the rate limit of recheck requests.
const reasonRecheck = "recheck"

// problemReporter turns failed coderd requests into rate-limited events
// and, on a rejected token, asks for an early access check.
type problemReporter struct {
	recorder events.EventRecorder // nil records nothing
	// recheck, when set, asks the controller to check the control plane's
	// operator access now instead of at its next interval.
	recheck func(types.NamespacedName)
	now     func() time.Time

	mu   sync.Mutex
	last map[problemKey]time.Time
}

type problemKey struct {
	controlPlane types.NamespacedName
	reason       string
}

func newProblemReporter(recorder events.EventRecorder, recheck func(types.NamespacedName)) *problemReporter {
	return &problemReporter{recorder: recorder, recheck: recheck, now: time.Now, last: map[problemKey]time.Time{}}
}

// observer returns the coderapi.Target.Observe of the client of ccp,
// which calls coderd at coderURL.
func (r *problemReporter) observer(ccp *coderv1alpha1.CoderControlPlane, coderURL string) func(string, int, error) {
	if r == nil || (r.recorder == nil && r.recheck == nil) {
		return nil
	}
	// Only what the event needs, not the (cached, shared) object.
	ref := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ccp.Namespace, Name: ccp.Name, UID: ccp.UID}}
	key := types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}
	return func(op string, status int, err error) {
		var reason, note string
		switch {
		case err != nil:
			reason = ReasonCoderdUnreachable
			note = fmt.Sprintf("The aggregated API could not reach coderd at %s (%s: %s); requests for this control plane's workspaces and templates fail until it answers",
				coderURL, op, coderapi.TransportError(err))
		case status == http.StatusUnauthorized:
			reason = ReasonOperatorTokenRejected
			note = fmt.Sprintf("coderd at %s rejected the operator token (401 on %s); the controller issues a new one when it next checks operator access, until then requests for this control plane's workspaces and templates fail",
				coderURL, op)
		default:
			return
		}
		if reason == ReasonOperatorTokenRejected && r.recheck != nil && r.allowEvery(problemKey{key, reasonRecheck}, recheckInterval) {
			r.recheck(key)
		}
		if r.recorder != nil && r.allow(problemKey{key, reason}) {
			// The note is an argument, so that a % in it prints as is.
			r.recorder.Eventf(ref, nil, corev1.EventTypeWarning, reason, "CallCoder", "%s", note)
		}
	}
}

// allow reports whether an event for k may be recorded now, and if so
// remembers that it was.
func (r *problemReporter) allow(k problemKey) bool { return r.allowEvery(k, problemEventInterval) }

// allowEvery reports whether k may happen now, at most once per interval,
// and if so remembers that it did.
func (r *problemReporter) allowEvery(k problemKey, interval time.Duration) bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if last, ok := r.last[k]; ok && now.Sub(last) < interval {
		return false
	}
	for old, t := range r.last {
		// Older than the longest interval: of no more use.
		if now.Sub(t) >= problemEventInterval {
			delete(r.last, old)
		}
	}
	r.last[k] = now
	return true
}
