package controlplane

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

func TestPhase(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason}
	}
	const (
		T = metav1.ConditionTrue
		F = metav1.ConditionFalse
	)
	avail := cond(coderv1alpha1.ConditionAvailable, T, coderv1alpha1.ReasonDeploymentAvailable)
	unavail := cond(coderv1alpha1.ConditionAvailable, F, coderv1alpha1.ReasonDeploymentUnavailable)
	access := cond(coderv1alpha1.ConditionOperatorAccessReady, T, coderv1alpha1.ReasonTokenValid)
	noAccess := cond(coderv1alpha1.ConditionOperatorAccessReady, F, coderv1alpha1.ReasonCoderdUnreachable)
	reconciled := cond(coderv1alpha1.ConditionReconciled, T, coderv1alpha1.ReasonApplied)

	for _, tc := range []struct {
		name  string
		prev  coderv1alpha1.Phase
		conds []metav1.Condition
		want  coderv1alpha1.Phase
	}{
		{"first reconcile", "", []metav1.Condition{reconciled, unavail, noAccess}, coderv1alpha1.PhaseProvisioning},
		{"all good", coderv1alpha1.PhaseProvisioning, []metav1.Condition{reconciled, avail, access}, coderv1alpha1.PhaseReady},
		{"access disabled on purpose", "", []metav1.Condition{avail, cond(coderv1alpha1.ConditionOperatorAccessReady, F, coderv1alpha1.ReasonDisabled)}, coderv1alpha1.PhaseReady},
		{"available, access not yet", coderv1alpha1.PhaseProvisioning, []metav1.Condition{reconciled, avail, noAccess}, coderv1alpha1.PhaseProvisioning},
		{"lost availability", coderv1alpha1.PhaseReady, []metav1.Condition{reconciled, unavail, access}, coderv1alpha1.PhaseDegraded},
		{"lost access", coderv1alpha1.PhaseReady, []metav1.Condition{reconciled, avail, noAccess}, coderv1alpha1.PhaseDegraded},
		{"not exposed", "", []metav1.Condition{reconciled, avail, access, cond(coderv1alpha1.ConditionExposed, F, coderv1alpha1.ReasonGatewayAPINotInstalled)}, coderv1alpha1.PhaseDegraded},
		{"license refused", "", []metav1.Condition{avail, access, cond(coderv1alpha1.ConditionLicenseApplied, F, "Invalid")}, coderv1alpha1.PhaseDegraded},
		{"missing secret", "", []metav1.Condition{cond(coderv1alpha1.ConditionReconciled, F, coderv1alpha1.ReasonSecretNotFound), unavail, noAccess}, coderv1alpha1.PhasePending},
		{"missing secret, old pods serve", coderv1alpha1.PhaseReady, []metav1.Condition{cond(coderv1alpha1.ConditionReconciled, F, coderv1alpha1.ReasonSecretNotFound), avail, access}, coderv1alpha1.PhaseDegraded},
		{"owner secret missing", "", []metav1.Condition{avail, cond(coderv1alpha1.ConditionOperatorAccessReady, F, coderv1alpha1.ReasonOwnerSecretMissing)}, coderv1alpha1.PhasePending},
		{"child refused", coderv1alpha1.PhaseReady, []metav1.Condition{cond(coderv1alpha1.ConditionReconciled, F, coderv1alpha1.ReasonApplyFailed), avail, access}, coderv1alpha1.PhaseFailed},
		{"transient apply error", coderv1alpha1.PhaseReady, []metav1.Condition{cond(coderv1alpha1.ConditionReconciled, F, coderv1alpha1.ReasonApplyError), avail, access}, coderv1alpha1.PhaseDegraded},
		{"owner credentials needed", "", []metav1.Condition{avail, cond(coderv1alpha1.ConditionOperatorAccessReady, F, coderv1alpha1.ReasonOwnerCredentialsRequired)}, coderv1alpha1.PhaseFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := computePhase(tc.prev, tc.conds); got != tc.want {
				t.Errorf("phase = %s, want %s", got, tc.want)
			}
		})
	}
}
