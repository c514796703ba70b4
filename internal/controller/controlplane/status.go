package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// computePhase summarizes the conditions:
//
//   - Failed: a child was refused (Reconciled=False/ApplyFailed) or
//     coderd refuses or lacks owner credentials
//     (OperatorAccessReady=False/OwnerCredentialsRequired,
//     OwnerCredentialsRejected or CredentialsURLMismatch): the spec or a
//     referenced object must change.
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
	restOK := trueOrAbsent(coderv1alpha1.ConditionReconciled) && trueOrAbsent(coderv1alpha1.ConditionExposed) &&
		trueOrAbsent(coderv1alpha1.ConditionLicenseApplied) && trueOrAbsent(coderv1alpha1.ConditionInitialized)

	switch {
	case falseWith(coderv1alpha1.ConditionReconciled, coderv1alpha1.ReasonApplyFailed, coderv1alpha1.ReasonWorkspaceRBACRefused),
		falseWith(coderv1alpha1.ConditionOperatorAccessReady, coderv1alpha1.ReasonOwnerCredentialsRequired, coderv1alpha1.ReasonOwnerCredentialsRejected,
			coderv1alpha1.ReasonCredentialsURLMismatch):
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
	coderv1alpha1.ReasonWorkspaceRBACRefused:     true,
	coderv1alpha1.ReasonGatewayAPINotInstalled:   true,
	coderv1alpha1.ReasonOwnerCredentialsRequired: true,
	coderv1alpha1.ReasonOwnerSecretMissing:       true,
	coderv1alpha1.ReasonOwnerCredentialsRejected: true,
	coderv1alpha1.ReasonCredentialsURLMismatch:   true,
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
	{typ: coderv1alpha1.ConditionInitialized, becameTrue: "Initialized", trueOnlyAfterFalse: true},
	{typ: coderv1alpha1.ConditionAvailable, becameTrue: "Available", lost: "Unavailable"},
	{typ: coderv1alpha1.ConditionOperatorAccessReady, becameTrue: "OperatorAccessReady", lost: "OperatorAccessLost"},
	{typ: coderv1alpha1.ConditionLicenseApplied, becameTrue: "LicenseApplied"},
}

// transitions returns the events for the condition changes between two
// reconciles, none for a condition that stayed as it was.
func transitions(before, after []metav1.Condition) []reconcile.Event {
	var evs []reconcile.Event
	announce := func(eventType, reason, note string) {
		evs = append(evs, reconcile.Event{Type: eventType, Reason: reason, Action: "Reconcile", Note: note})
	}
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
			announce(corev1.EventTypeNormal, te.becameTrue, n.Message)
		case metav1.ConditionFalse:
			switch {
			case o != nil && o.Status == metav1.ConditionTrue:
				reason := te.lost
				if reason == "" || problemReasons[n.Reason] {
					reason = n.Reason
				}
				announce(corev1.EventTypeWarning, reason, n.Message)
			case problemReasons[n.Reason] && (o == nil || o.Reason != n.Reason || o.Message != n.Message):
				announce(corev1.EventTypeWarning, n.Reason, n.Message)
			}
		}
	}
	return evs
}

// accessBackoff is when to check again access that has been failing
// since c's last transition (reconcile.Backoff).
func accessBackoff(c *metav1.Condition, now time.Time) time.Duration {
	if c == nil {
		return minAccessBackoff
	}
	return reconcile.Backoff(c.LastTransitionTime.Time, now, minAccessBackoff, maxAccessBackoff)
}

// setExposed sets the Exposed condition from the outcome of applying the
// Ingress or HTTPRoute.
func (r *Reconciler) setExposed(ccp *coderv1alpha1.CoderControlPlane, errs []error, okReason, okMessage string) {
	if len(errs) == 0 {
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionTrue, okReason, okMessage)
		return
	}
	reason := coderv1alpha1.ReasonApplyError
	if permanent(errs...) {
		reason = coderv1alpha1.ReasonApplyFailed
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionFalse, reason, errors.Join(errs...).Error())
}

// setReconciled sets the Reconciled condition: a refused workspace RBAC
// spec first, then refused children (they need a change), then missing
// Secrets.
func (r *Reconciler) setReconciled(ccp *coderv1alpha1.CoderControlPlane, refused error, errs []error, missing []string) {
	var missingMsg string
	if len(missing) > 0 {
		missingMsg = fmt.Sprintf("Secret(s) %s referenced by spec.tls or spec.caCerts not found in namespace %s; coderd pods cannot start until they exist",
			strings.Join(missing, ", "), ccp.Namespace)
	}
	switch {
	case refused != nil:
		msg := refused.Error()
		if len(errs) > 0 {
			msg += "; " + errors.Join(errs...).Error()
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonWorkspaceRBACRefused, msg)
	case len(errs) > 0:
		reason := coderv1alpha1.ReasonApplyError
		if permanent(errs...) {
			reason = coderv1alpha1.ReasonApplyFailed
		}
		msg := errors.Join(errs...).Error()
		if missingMsg != "" {
			msg += "; " + missingMsg
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, reason, msg)
	case len(missing) > 0:
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonSecretNotFound, missingMsg)
	default:
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied, "all children are up to date")
	}
}

// permanent reports whether any error needs a change to the spec or the
// cluster rather than a retry.
func permanent(errs ...error) bool {
	for _, err := range errs {
		var conflict *workload.ConflictError
		switch {
		case errors.As(err, &conflict), apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err),
			apierrors.IsNotFound(err): // NotFound on apply: the namespace does not exist
			return true
		}
	}
	return false
}

// setAvailableFromDeployment copies the Deployment's availability and
// replica counts into the status.
func (r *Reconciler) setAvailableFromDeployment(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	var dep appsv1.Deployment
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}, &dep)
	if apierrors.IsNotFound(err) {
		ccp.Status.Replicas, ccp.Status.ReadyReplicas = 0, 0
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
			fmt.Sprintf("Deployment %s does not exist yet", ccp.Name))
		return nil
	}
	if err != nil {
		return fmt.Errorf("get Deployment %s/%s: %w", ccp.Namespace, ccp.Name, err)
	}
	ccp.Status.Replicas = dep.Status.Replicas
	ccp.Status.ReadyReplicas = dep.Status.ReadyReplicas
	for _, c := range dep.Status.Conditions {
		if c.Type != appsv1.DeploymentAvailable {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonDeploymentAvailable,
				fmt.Sprintf("Deployment %s is available: %d of %d replicas ready", dep.Name, dep.Status.ReadyReplicas, ptrValue(dep.Spec.Replicas)))
			return nil
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
			fmt.Sprintf("Deployment %s is not available (%s): %s", dep.Name, c.Reason, c.Message))
		return nil
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
		fmt.Sprintf("Deployment %s has not reported availability yet: %d of %d replicas ready", dep.Name, dep.Status.ReadyReplicas, ptrValue(dep.Spec.Replicas)))
	return nil
}
