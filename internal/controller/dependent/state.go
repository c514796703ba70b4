package dependent

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/coder/coder/v2/codersdk"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// Object is a kind that references a control plane; the API types
// CoderProvisioner and CoderWorkspaceProxy implement it.
type Object interface {
	reconcile.Object
	SetReplicas(replicas, ready int32)
}

// State is one reconcile's view of a dependent object: the pass's status,
// built in the object (package reconcile), with what the dependent kinds
// report alike.
type State struct {
	*reconcile.Status
	obj Object
}

// NewState starts a reconcile of obj, whose status is *status, and marks
// the conditions not evaluated yet as Unknown.
func NewState[S any, P interface {
	*S
	DeepCopy() *S
}](obj Object, status P) *State {
	st := &State{Status: reconcile.Begin(obj, status), obj: obj}
	for _, t := range []string{
		coderv1alpha1.ConditionControlPlaneReady,
		coderv1alpha1.ConditionFeatureSupported,
		coderv1alpha1.ConditionCredentialsReady,
		coderv1alpha1.ConditionAvailable,
	} {
		if apimeta.FindStatusCondition(obj.GetConditions(), t) == nil {
			reconcile.SetCondition(obj, t, metav1.ConditionUnknown, coderv1alpha1.ReasonReconciling, "not evaluated yet")
		}
	}
	return st
}

// waitingPhase is the phase while something the object needs is missing:
// Degraded when it was ready before, otherwise Pending.
func (st *State) waitingPhase() coderv1alpha1.Phase {
	switch st.StartPhase() {
	case coderv1alpha1.PhaseReady, coderv1alpha1.PhaseDegraded:
		return coderv1alpha1.PhaseDegraded
	default:
		return coderv1alpha1.PhasePending
	}
}

// Waiting sets condType False with reason and message (and a Warning
// event) and the phase waitingPhase: something the object needs is
// missing.
func (st *State) Waiting(condType, reason, message string) {
	st.SetCondition(condType, metav1.ConditionFalse, reason, message, corev1.EventTypeWarning)
	st.obj.SetPhase(st.waitingPhase())
}

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
	st.obj.SetPhase(coderv1alpha1.PhaseUnsupported)
	return true
}

// Supported sets FeatureSupported True; what names the feature.
func (st *State) Supported(what string) {
	st.SetCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionTrue, coderv1alpha1.ReasonSupported, "coderd offers "+what, "")
}

// How often the outcomes of a pass that Offered and Deployed report are
// checked again.
const (
	// UnsupportedRequeue is how often a coderd without the kind's feature
	// is asked again (a license may be added).
	UnsupportedRequeue = 10 * time.Minute
	// SteadyRequeue re-checks, when everything is ready, what the object
	// holds in Coder (that a provisioner key still exists, a proxy's
	// registration) and notices a rotated supplied token.
	SteadyRequeue = 10 * time.Minute
)

// Feature is the Coder feature a dependent kind needs, as the
// FeatureSupported condition names it.
type Feature struct {
	// Name names the feature ("workspace proxies").
	Name string
	// Missing names it where coderd does not offer it; Name when empty.
	Missing string
}

// Offered reports whether coderd offers f, from err, the outcome of call,
// the pass's first request that needs it (what for the error). coderd
// answered, so the control plane is ready; then FeatureSupported is set
// (Unsupported, Supported). When ok is false, res and err are the pass's:
// a check again after UnsupportedRequeue, or the failed call
// (CoderError).
func (st *State) Offered(ccp *coderv1alpha1.CoderControlPlane, f Feature, call string, err error) (ok bool, res ctrl.Result, _ error) {
	if st.Unsupported(err, cmp.Or(f.Missing, f.Name)) {
		st.SetControlPlaneReady(ccp)
		return false, ctrl.Result{RequeueAfter: UnsupportedRequeue}, nil
	}
	if err != nil {
		return false, ctrl.Result{}, st.CoderError(call, err)
	}
	st.SetControlPlaneReady(ccp)
	st.Supported(f.Name)
	return true, ctrl.Result{}, nil
}

// CredentialsFailed reports err, the failure to ensure what the object
// holds in Coder (what, for the error): a conflict as CredentialsReady
// Failed, checked again after FailedRequeue, otherwise as CoderError. Its
// results are the pass's.
func (st *State) CredentialsFailed(what string, err error) (ctrl.Result, error) {
	if st.Conflict(coderv1alpha1.ConditionCredentialsReady, err) {
		return ctrl.Result{RequeueAfter: FailedRequeue}, nil
	}
	return ctrl.Result{}, st.CoderError(what, err)
}

// Deployed ends a pass that applied the object's workload, whose live
// Deployment is dep unless the apply failed with err: it reports the
// Deployment's availability (SetAvailability) and checks again after
// SteadyRequeue, or reports a conflict as Available Failed, checked again
// after FailedRequeue. Its results are the pass's.
func (st *State) Deployed(dep *appsv1.Deployment, err error) (ctrl.Result, error) {
	if err != nil {
		if st.Conflict(coderv1alpha1.ConditionAvailable, err) {
			return ctrl.Result{RequeueAfter: FailedRequeue}, nil
		}
		return ctrl.Result{}, err
	}
	st.SetAvailability(dep)
	return ctrl.Result{RequeueAfter: SteadyRequeue}, nil
}

// Failed sets condType False with reason and message (and a Warning
// event) and the phase Failed: the object needs a change to progress.
func (st *State) Failed(condType, reason, message string) {
	st.SetCondition(condType, metav1.ConditionFalse, reason, message, corev1.EventTypeWarning)
	st.obj.SetPhase(coderv1alpha1.PhaseFailed)
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
		st.Waiting(coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ReasonOperatorAccessNotReady,
			what+": coderd rejected the operator's token: "+coderapi.Message(err))
	case errors.As(err, &sdkErr):
		st.Waiting(coderv1alpha1.ConditionCredentialsReady, coderv1alpha1.ReasonCoderAPIError,
			what+": "+coderapi.Message(err))
	case errors.As(err, &urlErr) || errors.As(err, &netErr):
		st.Waiting(coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ReasonCoderdUnreachable,
			err.Error())
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
	st.obj.SetReplicas(dep.Status.Replicas, dep.Status.ReadyReplicas)
	ready := dep.Status.ReadyReplicas
	switch {
	case desired == 0:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonScaledToZero, "the Deployment is scaled to zero replicas", "")
		st.obj.SetPhase(coderv1alpha1.PhaseReady)
	case ready >= desired && dep.Status.ObservedGeneration >= dep.Generation:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonReplicasReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), corev1.EventTypeNormal)
		st.obj.SetPhase(coderv1alpha1.PhaseReady)
	default:
		st.SetCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonReplicasNotReady,
			fmt.Sprintf("%d/%d replicas ready", ready, desired), "")
		// Degraded once it was ready, as while waiting.
		if st.waitingPhase() == coderv1alpha1.PhaseDegraded {
			st.obj.SetPhase(coderv1alpha1.PhaseDegraded)
		} else {
			st.obj.SetPhase(coderv1alpha1.PhaseProvisioning)
		}
	}
}
