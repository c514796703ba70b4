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
// coderURL for ccp and reports the result (ReconcileAt with no Dial).
func (m *Manager) Reconcile(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) (Result, error) {
	return m.ReconcileAt(ctx, ccp, Endpoint{URL: coderURL})
}

// ReconcileAt establishes or checks the operator's access to the coderd
// at ep for ccp and reports the result. It is idempotent: at steady state
// it makes one Coder call (a token check) per ValidateEvery and no
// Kubernetes writes. With ep.Dial set (setup of a coderd not exposed
// yet), the result also says whether coderd has its first user.
func (m *Manager) ReconcileAt(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, ep Endpoint) (Result, error) {
	res, err := m.reconcile(ctx, ccp, ep)
	if err != nil || ep.Dial == "" {
		return res, err
	}
	if res.Ready {
		res.FirstUser = true
		return res, nil
	}
	if u, perr := url.Parse(ep.Dial); perr == nil && u.Host != "" {
		anon := coderapi.NewClient(u, "", m.timeout(), m.target(ccp))
		defer coderapi.CloseIdle(anon)
		res.FirstUser, _ = anon.HasFirstUser(ctx)
	}
	return res, nil
}

func (m *Manager) reconcile(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, ep Endpoint) (Result, error) {
	coderURL := ep.URL
	log := logf.FromContext(ctx).WithValues("coderURL", coderURL)
	if ccp.Spec.OperatorAccess.Disabled {
		if err := m.Revoke(ctx, ccp, coderURL); err != nil {
			return Result{}, fmt.Errorf("revoke disabled operator access: %w", err)
		}
		m.forget(ccp)
		return Result{Reason: coderv1alpha1.ReasonDisabled, Message: "operator access is disabled (spec.operatorAccess.disabled)"}, nil
	}
	if _, err := coderapi.NormalizeURL(coderURL); err != nil {
		return Result{Reason: coderv1alpha1.ReasonCoderdUnreachable, Message: fmt.Sprintf("invalid coderd URL %q", coderURL)}, nil
	}
	dial := coderURL
	if ep.Dial != "" {
		dial = ep.Dial
		log = log.WithValues("dial", dial)
	}
	u, err := url.Parse(dial)
	if err != nil || u.Host == "" {
		return Result{Reason: coderv1alpha1.ReasonCoderdUnreachable, Message: fmt.Sprintf("invalid coderd URL %q", dial)}, nil
	}
	at := coderd{url: coderURL, dial: u}

	secret, err := m.getSecret(ctx, ccp.Namespace, coderapi.TokenSecretName(ccp.Name))
	if err != nil {
		return Result{}, err
	}
	if r, ok := m.cached(ccp, secret, coderURL); ok {
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
		if secret != nil && coderapi.SameURL(secret.Annotations[coderapi.AnnotationCoderURL], coderURL) && len(secret.Data[coderapi.TokenKey]) > 0 {
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

	// A token issued by another coderd (the URL changed) is never sent to
	// this one: it is replaced, with owner credentials bound to this URL.
	if secret != nil && coderapi.SameURL(secret.Annotations[coderapi.AnnotationCoderURL], coderURL) {
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
			secret, err = m.issueToken(ctx, ccp, at, secret, &res, self)
			if err != nil || secret == nil {
				return res, err
			}
			m.event(ccp, corev1.EventTypeNormal, "OperatorTokenRotated", "Issued a new operator token")
		}
	} else {
		secret, err = m.issueToken(ctx, ccp, at, secret, &res, nil)
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
	due, err := m.revokeReplaced(ctx, ccp, u, secret)
	if err != nil {
		// Access itself is fine: the replaced tokens stay recorded and
		// are tried again soon.
		log.Info("could not revoke the replaced operator tokens; retrying", "error", err.Error())
		due = retryUnreachable
	}
	if due > 0 {
		res.RequeueAfter = min(res.RequeueAfter, due)
	}
	m.remember(ccp, secret, coderURL, res)
	return res, nil
}
