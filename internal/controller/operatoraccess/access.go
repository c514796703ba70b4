package operatoraccess

import (
	"context"
	"fmt"
	"net/url"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// The operator's identity in coderd. One user per coderd; each control
// plane pointing at that coderd holds its own token.
const (
	OperatorUsername = "coder-k8s"
	operatorEmail    = "coder-k8s-operator@coder-k8s.invalid"
)

// Reconcile establishes or checks the operator's access to coderd at
// coderURL for ccp and reports the result. It is idempotent: at steady
// state it makes one Coder call (a token check) per ValidateEvery and no
// Kubernetes writes.
func (m *Manager) Reconcile(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) (Result, error) {
	log := logf.FromContext(ctx).WithValues("coderURL", coderURL)
	if ccp.Spec.OperatorAccess.Disabled {
		if err := m.Revoke(ctx, ccp, coderURL); err != nil {
			return Result{}, fmt.Errorf("revoke disabled operator access: %w", err)
		}
		m.forget(ccp)
		return Result{Reason: coderv1alpha1.ReasonDisabled, Message: "operator access is disabled (spec.operatorAccess.disabled)"}, nil
	}
	u, err := url.Parse(coderURL)
	if err != nil || u.Host == "" {
		return Result{Reason: coderv1alpha1.ReasonCoderdUnreachable, Message: fmt.Sprintf("invalid coderd URL %q", coderURL)}, nil
	}

	secret, err := m.getSecret(ctx, ccp.Namespace, coderapi.TokenSecretName(ccp.Name))
	if err != nil {
		return Result{}, err
	}
	if r, ok := m.cached(ccp, secret); ok {
		return r, nil
	}

	anon := coderapi.NewClient(u, "", m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(anon)
	info, err := anon.BuildInfo(ctx)
	if err != nil {
		log.V(1).Info("coderd unreachable", "error", err.Error())
		// Retried no later than a reachable coderd is checked, so that
		// recovery shows as soon as an outage did.
		res := Result{Reason: coderv1alpha1.ReasonCoderdUnreachable, Message: "coderd at " + coderURL + " is unreachable: " + coderapi.Message(err),
			RequeueAfter: min(retryUnreachable, m.validateEvery())}
		if secret != nil && secret.Annotations[annotationCoderURL] == coderURL && len(secret.Data[coderapi.TokenKey]) > 0 {
			// An outage says nothing about the token: keep it in use, so
			// that requests fail with 503 until coderd is back instead of
			// the control plane's objects disappearing.
			res.Unverified = true
			res.TokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: secret.Name, Key: coderapi.TokenKey}
			res.User = OperatorUsername
			res.Message += "; the operator keeps its last token until coderd answers"
		}
		return res, nil
	}
	res := Result{CoderVersion: info.Version}

	// A token issued by another coderd (the URL changed) is not checked
	// against this one: it is replaced.
	if secret != nil && secret.Annotations[annotationCoderURL] == coderURL {
		state, err := m.checkToken(ctx, ccp, u, secret)
		if err != nil {
			return m.apiError(res, "check the operator token", err), nil
		}
		if state != tokenValid {
			var self *codersdk.Client
			if state == tokenExpiring {
				// A token that still works renews itself (the operator
				// user is an owner), so rotation does not depend on the
				// owner token staying valid: coderd caps those at 168h.
				self = coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
				defer coderapi.CloseIdle(self)
				log.Info("operator token near expiry; issuing a new one")
			} else {
				log.Info("operator token revoked or expired; issuing a new one")
			}
			secret, err = m.issueToken(ctx, ccp, u, secret, &res, self)
			if err != nil || secret == nil {
				return res, err
			}
			m.event(ccp, corev1.EventTypeNormal, "OperatorTokenRotated", "Issued a new operator token")
		}
	} else {
		secret, err = m.issueToken(ctx, ccp, u, secret, &res, nil)
		if err != nil || secret == nil {
			return res, err
		}
		m.event(ccp, corev1.EventTypeNormal, "OperatorTokenIssued", "Issued an operator token for coder user "+OperatorUsername)
	}

	operator := coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(operator)
	res.Ready = true
	res.Reason = coderv1alpha1.ReasonTokenValid
	res.Message = "the operator holds a valid token for coder user " + OperatorUsername
	res.User = OperatorUsername
	res.TokenSecretRef = &coderv1alpha1.SecretKeyReference{Name: secret.Name, Key: coderapi.TokenKey}
	if admin, err := m.getSecret(ctx, ccp.Namespace, AdminSecretName(ccp)); err != nil {
		return Result{}, err
	} else if admin != nil {
		res.AdminCredentialsSecret = admin.Name
	}
	// The license first, so the entitlements reported include it.
	if ccp.Spec.License != nil {
		lr, err := m.applyLicense(ctx, ccp, operator, secret)
		if err != nil {
			return Result{}, err
		}
		res.License = lr
	}
	res.Entitlements = entitlements(ctx, operator)
	res.RequeueAfter = m.validateEvery()
	m.remember(ccp, secret, res)
	return res, nil
}
