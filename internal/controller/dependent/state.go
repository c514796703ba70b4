package dependent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"

	"github.com/coder/coder/v2/codersdk"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// Status points at the fields every dependent kind's status has. The
// status types are distinct API types, so the shared code reaches their
// common fields through these pointers into the status being built.
type Status struct {
	ObservedGeneration *int64
	Phase              *coderv1alpha1.Phase
	Replicas           *int32
	ReadyReplicas      *int32
	Conditions         *[]metav1.Condition
}

// State is one reconcile's view of a dependent object: the status being
// built (a copy of the object's, owned by the kind's reconciler) and the
// events to emit once that status is written.
type State struct {
	obj    client.Object
	status Status
	// prevPhase is the phase the object had when the reconcile started.
	prevPhase coderv1alpha1.Phase
	events    []pendingEvent
	// commit copies the built status into obj and reports whether it
	// differs from what obj had.
	commit func() bool
}

type pendingEvent struct {
	eventType, reason, action, note string
}

// NewState starts a reconcile of obj, whose status is live; built is the
// copy the reconcile fills in, and fields point into built. It stamps the
// generation and marks the conditions not evaluated yet as Unknown.
func NewState[S any](obj client.Object, live, built *S, fields Status) *State {
	st := &State{
		obj:       obj,
		status:    fields,
		prevPhase: *fields.Phase,
		commit: func() bool {
			if equality.Semantic.DeepEqual(*live, *built) {
				return false
			}
			*live = *built
			return true
		},
	}
	*fields.ObservedGeneration = obj.GetGeneration()
	for _, t := range []string{
		coderv1alpha1.ConditionControlPlaneReady,
		coderv1alpha1.ConditionFeatureSupported,
		coderv1alpha1.ConditionCredentialsReady,
		coderv1alpha1.ConditionAvailable,
	} {
		if apimeta.FindStatusCondition(*fields.Conditions, t) == nil {
			apimeta.SetStatusCondition(fields.Conditions, metav1.Condition{
				Type: t, Status: metav1.ConditionUnknown, Reason: coderv1alpha1.ReasonReconciling,
				Message: "not evaluated yet", ObservedGeneration: obj.GetGeneration(),
			})
		}
	}
	return st
}

// writeStatus writes the status only when it changed.
func (st *State) writeStatus(ctx context.Context, c client.Client) error {
	if !st.commit() {
		return nil
	}
	return c.Status().Update(ctx, st.obj)
}

// SetCondition sets a condition at the object's generation; when its
// status or reason changes and eventType is set, an event with the
// condition's reason and message is queued (events only on transitions).
func (st *State) SetCondition(condType string, status metav1.ConditionStatus, reason, message, eventType string) {
	message = workload.Message(message)
	old := apimeta.FindStatusCondition(*st.status.Conditions, condType)
	changed := old == nil || old.Status != status || old.Reason != reason
	apimeta.SetStatusCondition(st.status.Conditions, metav1.Condition{
		Type: condType, Status: status, Reason: reason, Message: message,
		ObservedGeneration: st.obj.GetGeneration(),
	})
	if changed && eventType != "" {
		st.Event(eventType, reason, "Reconcile", message)
	}
}

// Event queues an event about the object.
func (st *State) Event(eventType, reason, action, note string) {
	st.events = append(st.events, pendingEvent{eventType, reason, action, note})
}

// emit records the queued events; it runs after the status is written so
// that a failed write does not leave events for a transition that was not
// recorded.
func (st *State) emit(rec events.EventRecorder) {
	if rec == nil {
		return
	}
	for _, e := range st.events {
		rec.Eventf(st.obj, nil, e.eventType, e.reason, e.action, "%s", workload.Message(e.note))
	}
	st.events = nil
}

// WaitingPhase is the phase while something the object needs is missing:
// Degraded when it was ready before, otherwise Pending.
func (st *State) WaitingPhase() coderv1alpha1.Phase {
	switch st.prevPhase {
	case coderv1alpha1.PhaseReady, coderv1alpha1.PhaseDegraded:
		return coderv1alpha1.PhaseDegraded
	default:
		return coderv1alpha1.PhasePending
	}
}

func (st *State) setWaiting() { *st.status.Phase = st.WaitingPhase() }

// SetControlPlaneReady records that the operator reaches ccp's coderd.
func (st *State) SetControlPlaneReady(ccp *coderv1alpha1.CoderControlPlane) {
	st.SetCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionTrue, coderv1alpha1.ReasonReady, "the operator reaches coderd at "+ccp.Status.URL, "")
}

// Unsupported reports whether err says that coderd lacks the feature
// (open-source build or not entitled); if so it sets FeatureSupported
// False with Coder's message (what names the feature) and the phase
// Unsupported.
func (st *State) Unsupported(err error, what string) bool {
	reason, unavailable := coderapi.FeatureUnavailable(err)
	if !unavailable {
		return false
	}
	st.SetCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionFalse, reason,
		"coderd does not offer "+what+": "+coderapi.Message(err), corev1.EventTypeWarning)
	*st.status.Phase = coderv1alpha1.PhaseUnsupported
	return true
}

// Supported sets FeatureSupported True; what names the feature.
func (st *State) Supported(what string) {
	st.SetCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionTrue, coderv1alpha1.ReasonSupported, "coderd offers "+what, "")
}

// Failed sets condType False with reason and message (and a Warning
// event) and the phase Failed: the object needs a change to progress.
func (st *State) Failed(condType, reason, message string) {
	st.SetCondition(condType, metav1.ConditionFalse, reason, message, corev1.EventTypeWarning)
	*st.status.Phase = coderv1alpha1.PhaseFailed
}

// Conflict reports whether err is a *workload.ConflictError; if so it reports it
// as condType Failed with the conflict's reason.
func (st *State) Conflict(condType string, err error) bool {
	var conflict *workload.ConflictError
	if !errors.As(err, &conflict) {
		return false
	}
	st.Failed(condType, conflict.Reason, conflict.Error())
	return true
}

// CoderError records a failed Coder API call in the conditions and returns
// err wrapped with what was attempted. Errors that are not from coderd
// (Kubernetes API errors) leave the conditions alone.
func (st *State) CoderError(what string, err error) error {
	err = fmt.Errorf("%s: %w", what, err)
	var sdkErr *codersdk.Error
	var urlErr *url.Error
	var netErr net.Error
	switch {
	case errors.As(err, &sdkErr) && coderapi.IsUnauthorized(err):
		st.SetCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, coderv1alpha1.ReasonOperatorAccessNotReady,
			what+": coderd rejected the operator's token: "+coderapi.Message(err), corev1.EventTypeWarning)
		st.setWaiting()
	case errors.As(err, &sdkErr):
		st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, coderv1alpha1.ReasonCoderAPIError,
			what+": "+coderapi.Message(err), corev1.EventTypeWarning)
		st.setWaiting()
	case errors.As(err, &urlErr) || errors.As(err, &netErr):
		st.SetCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable,
			err.Error(), corev1.EventTypeWarning)
		st.setWaiting()
	}
	return err
}

// SetAvailability reports the Deployment's replicas, the Available
// condition and the phase. Scaled to zero counts as Ready (nothing to wait
// for) but not Available (nothing serves).
func (st *State) SetAvailability(dep *appsv1.Deployment) {
	desired := int32(1)
	if dep.Spec.Replicas != nil {
		desired = *dep.Spec.Replicas
	}
	*st.status.Replicas = dep.Status.Replicas
	*st.status.ReadyReplicas = dep.Status.ReadyReplicas
	ready := dep.Status.ReadyReplicas
	switch {
	case desired == 0:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonScaledToZero, "the Deployment is scaled to zero replicas", "")
		*st.status.Phase = coderv1alpha1.PhaseReady
	case ready >= desired && dep.Status.ObservedGeneration >= dep.Generation:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonReplicasReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), corev1.EventTypeNormal)
		*st.status.Phase = coderv1alpha1.PhaseReady
	default:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonReplicasNotReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), "")
		if st.prevPhase == coderv1alpha1.PhaseReady || st.prevPhase == coderv1alpha1.PhaseDegraded {
			*st.status.Phase = coderv1alpha1.PhaseDegraded
		} else {
			*st.status.Phase = coderv1alpha1.PhaseProvisioning
		}
	}
}
