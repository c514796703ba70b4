package workspaceproxy

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// maxNote is the longest event note the events.k8s.io API accepts.
const maxNote = 1024

// maxConditionMessage bounds condition messages (the API allows 32768).
const maxConditionMessage = 4096

// state is one reconcile's view: the object, the status being built and
// the events to emit once that status is written.
type state struct {
	obj    *coderv1alpha1.CoderWorkspaceProxy
	status coderv1alpha1.CoderWorkspaceProxyStatus
	events []pendingEvent
}

type pendingEvent struct {
	eventType, reason, action, note string
}

func newState(obj *coderv1alpha1.CoderWorkspaceProxy) *state {
	st := &state{obj: obj, status: *obj.Status.DeepCopy()}
	st.status.ObservedGeneration = obj.Generation
	for _, t := range []string{
		coderv1alpha1.ConditionControlPlaneReady,
		coderv1alpha1.ConditionFeatureSupported,
		coderv1alpha1.ConditionCredentialsReady,
		coderv1alpha1.ConditionAvailable,
	} {
		if apimeta.FindStatusCondition(st.status.Conditions, t) == nil {
			apimeta.SetStatusCondition(&st.status.Conditions, metav1.Condition{
				Type: t, Status: metav1.ConditionUnknown, Reason: ReasonReconciling,
				Message: "not evaluated yet", ObservedGeneration: obj.Generation,
			})
		}
	}
	return st
}

// setCondition sets a condition; when its status or reason changes and
// eventType is set, an event with the condition's reason and message is
// queued (events only on transitions).
func (st *state) setCondition(condType string, status metav1.ConditionStatus, reason, message, eventType string) {
	message = truncate(message, maxConditionMessage)
	old := apimeta.FindStatusCondition(st.status.Conditions, condType)
	changed := old == nil || old.Status != status || old.Reason != reason
	apimeta.SetStatusCondition(&st.status.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message,
		ObservedGeneration: st.obj.Generation,
	})
	if changed && eventType != "" {
		st.event(eventType, reason, "Reconcile", message)
	}
}

func (st *state) event(eventType, reason, action, note string) {
	st.events = append(st.events, pendingEvent{eventType, reason, action, note})
}

// emit records the queued events; it runs after the status is written so
// that a failed write does not leave events for a transition that was not
// recorded.
func (st *state) emit(rec events.EventRecorder) {
	if rec == nil {
		return
	}
	for _, e := range st.events {
		rec.Eventf(st.obj, nil, e.eventType, e.reason, e.action, "%s", truncate(e.note, maxNote))
	}
	st.events = nil
}

// waitingPhase is the phase while something the object needs is missing:
// Degraded when it was ready before, otherwise Pending.
func (st *state) waitingPhase() coderv1alpha1.Phase {
	switch st.obj.Status.Phase {
	case coderv1alpha1.PhaseReady, coderv1alpha1.PhaseDegraded:
		return coderv1alpha1.PhaseDegraded
	default:
		return coderv1alpha1.PhasePending
	}
}

// coderError records a failed Coder API call in the conditions and returns
// err wrapped with what was attempted. Errors that are not from coderd
// (Kubernetes API errors) leave the conditions alone.
func (st *state) coderError(what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	var sdkErr *codersdk.Error
	var urlErr *url.Error
	var netErr net.Error
	switch {
	case errors.As(err, &sdkErr) && coderapi.IsUnauthorized(err):
		st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, ReasonOperatorAccessNotReady,
			what+": coderd rejected the operator's token: "+coderapi.Message(err), corev1.EventTypeWarning)
		st.status.Phase = st.waitingPhase()
	case errors.As(err, &sdkErr):
		st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, ReasonCoderAPIError,
			what+": "+coderapi.Message(err), corev1.EventTypeWarning)
		st.status.Phase = st.waitingPhase()
	case errors.As(err, &urlErr) || errors.As(err, &netErr):
		st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, ReasonCoderdUnreachable,
			err.Error(), corev1.EventTypeWarning)
		st.status.Phase = st.waitingPhase()
	}
	return err
}

// setAvailability reports the Deployment's replicas, the Available
// condition and the phase. Scaled to zero counts as Ready (nothing to wait
// for) but not Available (nothing serves).
func (st *state) setAvailability(dep *appsv1.Deployment) {
	desired := int32(1)
	if dep.Spec.Replicas != nil {
		desired = *dep.Spec.Replicas
	}
	st.status.Replicas = dep.Status.Replicas
	st.status.ReadyReplicas = dep.Status.ReadyReplicas
	ready := dep.Status.ReadyReplicas
	switch {
	case desired == 0:
		st.setCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonScaledToZero, "the Deployment is scaled to zero replicas", "")
		st.status.Phase = coderv1alpha1.PhaseReady
	case ready >= desired && dep.Status.ObservedGeneration >= dep.Generation:
		st.setCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, ReasonReplicasReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), corev1.EventTypeNormal)
		st.status.Phase = coderv1alpha1.PhaseReady
	default:
		st.setCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, ReasonReplicasNotReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), "")
		if st.obj.Status.Phase == coderv1alpha1.PhaseReady || st.obj.Status.Phase == coderv1alpha1.PhaseDegraded {
			st.status.Phase = coderv1alpha1.PhaseDegraded
		} else {
			st.status.Phase = coderv1alpha1.PhaseProvisioning
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-3], "") + "..."
}

// conflictError means an object the reconciler would own exists and
// belongs to someone else; it is reported in a condition, not retried hot.
type conflictError struct {
	reason, msg string
}

func (e *conflictError) Error() string { return e.msg }
