package controlplane

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// Limits of the API: condition messages and event notes.
const (
	maxConditionMessage = 32768
	maxEventNote        = 1024
)

// setCondition sets a condition with the object's generation; its
// transition time changes only when its status does.
func setCondition(ccp *coderv1alpha1.CoderControlPlane, typ string, status metav1.ConditionStatus, reason, message string) {
	apimeta.SetStatusCondition(&ccp.Status.Conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            truncate(message, maxConditionMessage),
		ObservedGeneration: ccp.Generation,
	})
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// computePhase summarizes the conditions:
//
//   - Failed: a child was refused (Reconciled=False/ApplyFailed) or
//     coderd refuses or lacks owner credentials
//     (OperatorAccessReady=False/OwnerCredentialsRequired or
//     OwnerCredentialsRejected): the spec or a referenced object must
//     change.
//   - Pending: waiting for a referenced object: a Secret the pods mount
//     while coderd is not available (Reconciled=False/SecretNotFound), or
//     the owner Secret (OperatorAccessReady=False/OwnerSecretMissing).
//   - Ready: Available, operator access ready (or disabled on purpose),
//     and Reconciled, Exposed and LicenseApplied True where present.
//   - Degraded: coderd is available and the operator holds access, but
//     something else asked for is not in place (exposure, license, a
//     missing Secret for a rollout); or anything short of Ready after
//     having been Ready.
//   - Provisioning: otherwise, on the way to the first Ready.
func computePhase(prev coderv1alpha1.Phase, conds []metav1.Condition) coderv1alpha1.Phase {
	falseWith := func(typ string, reasons ...string) bool {
		c := apimeta.FindStatusCondition(conds, typ)
		if c == nil || c.Status != metav1.ConditionFalse {
			return false
		}
		for _, r := range reasons {
			if c.Reason == r {
				return true
			}
		}
		return false
	}
	trueOrAbsent := func(typ string) bool {
		c := apimeta.FindStatusCondition(conds, typ)
		return c == nil || c.Status == metav1.ConditionTrue
	}
	available := apimeta.IsStatusConditionTrue(conds, coderv1alpha1.ConditionAvailable)
	accessOK := apimeta.IsStatusConditionTrue(conds, coderv1alpha1.ConditionOperatorAccessReady) ||
		falseWith(coderv1alpha1.ConditionOperatorAccessReady, coderv1alpha1.ReasonDisabled)
	restOK := trueOrAbsent(coderv1alpha1.ConditionReconciled) && trueOrAbsent(coderv1alpha1.ConditionExposed) && trueOrAbsent(coderv1alpha1.ConditionLicenseApplied)

	switch {
	case falseWith(coderv1alpha1.ConditionReconciled, coderv1alpha1.ReasonApplyFailed),
		falseWith(coderv1alpha1.ConditionOperatorAccessReady, coderv1alpha1.ReasonOwnerCredentialsRequired, coderv1alpha1.ReasonOwnerCredentialsRejected):
		return coderv1alpha1.PhaseFailed
	case falseWith(coderv1alpha1.ConditionOperatorAccessReady, coderv1alpha1.ReasonOwnerSecretMissing),
		!available && falseWith(coderv1alpha1.ConditionReconciled, coderv1alpha1.ReasonSecretNotFound):
		return coderv1alpha1.PhasePending
	case available && accessOK && restOK:
		return coderv1alpha1.PhaseReady
	case available && accessOK,
		prev == coderv1alpha1.PhaseReady, prev == coderv1alpha1.PhaseDegraded:
		return coderv1alpha1.PhaseDegraded
	default:
		return coderv1alpha1.PhaseProvisioning
	}
}

// problemReasons are False reasons worth a Warning event even when the
// condition was never True: the user has something to fix.
var problemReasons = map[string]bool{
	coderv1alpha1.ReasonSecretNotFound:           true,
	coderv1alpha1.ReasonApplyFailed:              true,
	coderv1alpha1.ReasonGatewayAPINotInstalled:   true,
	coderv1alpha1.ReasonOwnerCredentialsRequired: true,
	coderv1alpha1.ReasonOwnerSecretMissing:       true,
	coderv1alpha1.ReasonOwnerCredentialsRejected: true,
}

// transitionEvents lists, per condition type, the event reasons for
// becoming True and for losing True; trueOnlyAfterFalse types announce
// True only as a recovery, not on the first reconcile.
var transitionEvents = []struct {
	typ                string
	becameTrue, lost   string
	trueOnlyAfterFalse bool
}{
	{typ: coderv1alpha1.ConditionReconciled, becameTrue: "Reconciled", trueOnlyAfterFalse: true},
	{typ: coderv1alpha1.ConditionExposed, becameTrue: "Exposed", trueOnlyAfterFalse: true},
	{typ: coderv1alpha1.ConditionAvailable, becameTrue: "Available", lost: "Unavailable"},
	{typ: coderv1alpha1.ConditionOperatorAccessReady, becameTrue: "OperatorAccessReady", lost: "OperatorAccessLost"},
	{typ: coderv1alpha1.ConditionLicenseApplied, becameTrue: "LicenseApplied"},
}

// recordTransitions emits events for condition changes between two
// reconciles, never for a condition that stayed as it was.
func (r *Reconciler) recordTransitions(ccp *coderv1alpha1.CoderControlPlane, before, after []metav1.Condition) {
	for _, te := range transitionEvents {
		n := apimeta.FindStatusCondition(after, te.typ)
		if n == nil {
			continue
		}
		o := apimeta.FindStatusCondition(before, te.typ)
		switch n.Status {
		case metav1.ConditionTrue:
			if o != nil && o.Status == metav1.ConditionTrue {
				continue
			}
			if te.trueOnlyAfterFalse && (o == nil || o.Status != metav1.ConditionFalse) {
				continue
			}
			r.event(ccp, corev1.EventTypeNormal, te.becameTrue, n.Message)
		case metav1.ConditionFalse:
			switch {
			case o != nil && o.Status == metav1.ConditionTrue:
				reason := te.lost
				if reason == "" || problemReasons[n.Reason] {
					reason = n.Reason
				}
				r.event(ccp, corev1.EventTypeWarning, reason, n.Message)
			case problemReasons[n.Reason] && (o == nil || o.Reason != n.Reason || o.Message != n.Message):
				r.event(ccp, corev1.EventTypeWarning, n.Reason, n.Message)
			}
		}
	}
}

// event records an event about ccp.
func (r *Reconciler) event(ccp *coderv1alpha1.CoderControlPlane, eventType, reason, note string) {
	if r.Recorder == nil {
		return
	}
	// The note is a format string for the recorder; pass it as an
	// argument so a % in an error message is printed as is.
	r.Recorder.Eventf(ccp, nil, eventType, reason, "Reconcile", "%s", truncate(note, maxEventNote))
}

// backoff grows with how long a condition has been failing: half that
// time, within [lo, hi]. It needs no state beyond the condition, so it
// survives restarts and resets when the condition recovers.
func backoff(c *metav1.Condition, now time.Time, lo, hi time.Duration) time.Duration {
	if c == nil {
		return lo
	}
	d := now.Sub(c.LastTransitionTime.Time) / 2
	return min(max(d, lo), hi)
}
