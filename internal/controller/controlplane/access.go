package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

// reconcileAccess runs the access manager against the coderd at ep and
// records its result. It returns when access should be checked again, and
// the result.
func (r *Reconciler) reconcileAccess(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, ep operatoraccess.Endpoint) (time.Duration, operatoraccess.Result) {
	setIdentity(ctx, ccp)
	actx, cancel := context.WithTimeout(ctx, valueOr(r.AccessTimeout, DefaultAccessTimeout))
	res, err := r.Access.ReconcileAt(actx, ccp.DeepCopy(), ep)
	cancel()
	adopted := ccp.Spec.ExternalURL != ""

	if err != nil {
		// Not a crash: the condition says what failed, and the check
		// is repeated with a backoff that grows while it keeps failing.
		reason := classifyAccessError(err)
		if res.Reason != "" && res.Reason != coderv1alpha1.ReasonTokenValid {
			// The manager classified the failure itself.
			reason = res.Reason
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, reason, "operator access: "+err.Error())
		if res.CoderVersion != "" {
			// It failed after coderd answered.
			ccp.Status.CoderVersion = res.CoderVersion
		}
		if adopted {
			setAdoptedAvailable(ccp, res.CoderVersion, reason,
				fmt.Sprintf("coderd at %s is unreachable: %v", ccp.Status.URL, err),
				"operator access failed before it reached coderd: "+err.Error())
		}
		r.setLicense(ccp, nil)
		logf.FromContext(ctx).Info("operator access failed", "url", ccp.Status.URL, "reason", reason, "error", err.Error())
		return accessBackoff(apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady), time.Now()), res
	}

	reason, msg := res.Reason, res.Message
	if reason == "" {
		reason = map[bool]string{true: coderv1alpha1.ReasonTokenValid, false: coderv1alpha1.ReasonAccessError}[res.Ready]
	}
	if msg == "" {
		msg = map[bool]string{true: "the operator holds a valid Coder token", false: "the operator holds no valid Coder token"}[res.Ready]
	}
	status := boolStatus(res.Ready)
	if res.Unverified {
		status = metav1.ConditionUnknown
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, status, reason, msg)

	st := &ccp.Status
	st.OperatorTokenSecretRef = res.TokenSecretRef // nil unless ready or unverified, so no one uses a token known to be bad
	switch {
	case res.User != "":
		st.OperatorUser = res.User
	case reason == coderv1alpha1.ReasonDisabled:
		st.OperatorUser = ""
	}
	if res.AdminCredentialsSecret != "" {
		st.AdminCredentialsSecretRef = &corev1.LocalObjectReference{Name: res.AdminCredentialsSecret}
	}
	// Keep the last known version and entitlements while coderd does
	// not answer; they describe the coderd, not the connection.
	if res.CoderVersion != "" {
		st.CoderVersion = res.CoderVersion
		st.Entitlements = res.Entitlements
	}
	if adopted {
		setAdoptedAvailable(ccp, res.CoderVersion, reason, msg, "operator access did not report coderd's version ("+reason+")")
	}
	r.setLicense(ccp, res.License)

	if !res.Ready && res.RequeueAfter <= 0 {
		return accessBackoff(apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady), time.Now()), res
	}
	if res.License != nil && res.License.Reason == coderv1alpha1.ReasonLicenseSecretMissing {
		// Users' Secrets are not watched: look for it again soon.
		return minPositive(res.RequeueAfter, missingSecretRecheck), res
	}
	return res.RequeueAfter, res
}

// setIdentity reports spec.identity.mode in IdentityMapped, and warns in
// the log when a control plane turns to Operator mode.
func setIdentity(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) {
	if ccp.Spec.Identity.Mode == "Operator" {
		prev := apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionIdentityMapped)
		if prev == nil || prev.Reason != coderv1alpha1.ReasonOperatorIdentity {
			logf.FromContext(ctx).Info("WARNING: spec.identity.mode is Operator: every caller of coderworkspaces, codertemplates and codertemplateversions in this namespace acts in Coder as the operator's owner user, so whoever Kubernetes RBAC lets read or change them may read and change anything in this coderd",
				"controlPlane", ccp.Namespace+"/"+ccp.Name)
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionIdentityMapped, metav1.ConditionFalse, coderv1alpha1.ReasonOperatorIdentity,
			"spec.identity.mode is Operator: every caller of the aggregated API and MCP acts in Coder as the operator's owner user "+ccp.Status.OperatorUser)
		return
	}
	reconcile.SetCondition(ccp, coderv1alpha1.ConditionIdentityMapped, metav1.ConditionTrue, coderv1alpha1.ReasonMapped,
		"each caller of the aggregated API and MCP acts in Coder as the Coder user their Kubernetes user maps to")
}

// setAdoptedAvailable sets Available of an adopted control plane, which
// has no Deployment to look at, from what operator access learnt: coderd
// answered when it reported its version; unreachable (with
// unreachableMsg) when access says so; otherwise unknown
// (unknownMsg).
func setAdoptedAvailable(ccp *coderv1alpha1.CoderControlPlane, coderVersion, accessReason, unreachableMsg, unknownMsg string) {
	switch {
	case coderVersion != "":
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonCoderdReachable,
			fmt.Sprintf("coderd %s answers at %s", coderVersion, ccp.Status.URL))
	case accessReason == coderv1alpha1.ReasonCoderdUnreachable:
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable, unreachableMsg)
	default:
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionUnknown, coderv1alpha1.ReasonReachabilityUnknown, unknownMsg)
	}
}

// setLicense sets LicenseApplied when spec.license is set; lic is nil when
// the access manager could not tell.
func (r *Reconciler) setLicense(ccp *coderv1alpha1.CoderControlPlane, lic *operatoraccess.LicenseResult) {
	if ccp.Spec.License == nil {
		apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionLicenseApplied)
		return
	}
	if lic != nil {
		reason := lic.Reason
		if reason == "" {
			reason = map[bool]string{true: coderv1alpha1.ReasonApplied, false: coderv1alpha1.ReasonLicenseNotApplied}[lic.Applied]
		}
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionLicenseApplied, boolStatus(lic.Applied), reason, lic.Message)
		return
	}
	if apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionLicenseApplied) == nil {
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionLicenseApplied, metav1.ConditionUnknown, coderv1alpha1.ReasonWaitingForAccess,
			"the license is uploaded once the operator has access to coderd")
	}
}

// classifyAccessError names the OperatorAccessReady reason for an error
// the access manager returned instead of a Result.
func classifyAccessError(err error) string {
	var netErr net.Error
	var urlErr *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr), errors.As(err, &urlErr):
		return coderv1alpha1.ReasonCoderdUnreachable
	case coderapi.StatusCode(err) != 0:
		return coderv1alpha1.ReasonCoderAPIError
	default:
		return coderv1alpha1.ReasonAccessError
	}
}
