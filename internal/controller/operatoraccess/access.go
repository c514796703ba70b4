package operatoraccess

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/metrics"
)

// The operator's identity in coderd. One user per coderd; each control
// plane pointing at that coderd holds its own token.
const (
	OperatorUsername = "coder-k8s"
	operatorEmail    = "coder-k8s-operator@coder-k8s.invalid"

	annotationTokenName = "coder.com/token-name"
	annotationTokenID   = "coder.com/token-id"
	annotationExpiresAt = "coder.com/token-expires-at"
	annotationCoderURL  = "coder.com/coder-url"
	annotationLicense   = "coder.com/license-sha256"

	defaultLifetime      = 168 * time.Hour
	defaultValidateEvery = 5 * time.Minute
	retryUnreachable     = 15 * time.Second
)

// AdminSecretName is the Secret holding the first user's credentials when
// the operator created that user.
func AdminSecretName(ccp *coderv1alpha1.CoderControlPlane) string {
	return ccp.Name + "-admin"
}

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

// Revoke deletes the operator's token in coderd and its Secret. A token
// coderd no longer knows counts as revoked; an unreachable coderd is an
// error, so the caller decides how long to keep trying.
func (m *Manager) Revoke(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) error {
	m.forget(ccp)
	secret, err := m.getSecret(ctx, ccp.Namespace, coderapi.TokenSecretName(ccp.Name))
	if err != nil || secret == nil {
		return err
	}
	if u, err := url.Parse(secret.Annotations[annotationCoderURL]); err == nil && u.Host != "" {
		c := coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
		defer coderapi.CloseIdle(c)
		err := c.DeleteAPIKey(ctx, codersdk.Me, secret.Annotations[annotationTokenID])
		switch {
		case err == nil:
			m.event(ccp, corev1.EventTypeNormal, "OperatorTokenRevoked", "Revoked the operator token in coderd")
		case coderapi.IsUnauthorized(err) || coderapi.IsNotFound(err):
			// Already revoked or expired.
		default:
			return fmt.Errorf("revoke operator token at %s: %w", u, err)
		}
	}
	if err := m.Client.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete operator token Secret %s: %w", secret.Name, err)
	}
	return nil
}

// tokenState is what checkToken found.
type tokenState int

const (
	tokenValid    tokenState = iota
	tokenExpiring            // authenticates, but within a third of its lifetime of expiry
	tokenRejected            // coderd answers 401: revoked or expired
)

// checkToken reports whether the stored token still authenticates and is
// not close to expiry.
func (m *Manager) checkToken(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, secret *corev1.Secret) (tokenState, error) {
	c := coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(c)
	if _, err := c.User(ctx, codersdk.Me); err != nil {
		if coderapi.IsUnauthorized(err) {
			return tokenRejected, nil
		}
		return tokenRejected, err
	}
	expires, err := time.Parse(time.RFC3339, secret.Annotations[annotationExpiresAt])
	if err != nil {
		return tokenExpiring, nil
	}
	lifetime, err := strconv.ParseInt(secret.Annotations[annotationLifetime], 10, 64)
	if err != nil || lifetime <= 0 {
		lifetime = int64(defaultLifetime / time.Second)
	}
	if time.Until(expires) > time.Duration(lifetime)*time.Second/3 {
		return tokenValid, nil
	}
	return tokenExpiring, nil
}

const annotationLifetime = "coder.com/token-lifetime-seconds"

// issueToken issues a new operator token with self (the operator's own,
// still valid token) when given, else, or when that fails in coderd, with
// an owner session. When no token can be issued it fills res with the
// reason and returns a nil Secret.
func (m *Manager) issueToken(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, old *corev1.Secret, res *Result, self *codersdk.Client) (*corev1.Secret, error) {
	if self != nil {
		before := *res
		secret, err := m.issueWith(ctx, ccp, u, old, res, self)
		if err != nil || secret != nil {
			return secret, err
		}
		logf.FromContext(ctx).Info("the operator token could not renew itself; using an owner session", "reason", res.Message)
		*res = before
	}
	owner, ok, err := m.ownerClient(ctx, ccp, u, res)
	if err != nil || !ok {
		return nil, err
	}
	defer coderapi.CloseIdle(owner)
	return m.issueWith(ctx, ccp, u, old, res, owner)
}

// issueWith makes sure, acting through owner, that the operator user
// exists with the owner role, creates a token for it, stores the token in
// the Secret and revokes the one it replaces.
func (m *Manager) issueWith(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, old *corev1.Secret, res *Result, owner *codersdk.Client) (*corev1.Secret, error) {
	user, err := owner.User(ctx, OperatorUsername)
	switch {
	case coderapi.IsNotFound(err) || coderapi.StatusCode(err) == http.StatusBadRequest:
		me, err := owner.User(ctx, codersdk.Me)
		if err != nil {
			*res = m.apiError(*res, "read the owner user", err)
			return nil, nil
		}
		user, err = owner.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: operatorEmail, Username: OperatorUsername, Name: "coder-k8s operator",
			UserLoginType: codersdk.LoginTypeNone, OrganizationIDs: me.OrganizationIDs,
		})
		if err != nil {
			*res = m.apiError(*res, "create the operator user", err)
			return nil, nil
		}
	case err != nil:
		*res = m.apiError(*res, "look up the operator user", err)
		return nil, nil
	}
	if !hasRole(user, codersdk.RoleOwner) {
		if _, err := owner.UpdateUserRoles(ctx, user.ID.String(), codersdk.UpdateRoles{Roles: []string{codersdk.RoleOwner}}); err != nil {
			*res = m.apiError(*res, "grant the operator user the owner role", err)
			return nil, nil
		}
	}

	lifetime := defaultLifetime
	if lt := ccp.Spec.OperatorAccess.TokenLifetime; lt != nil && lt.Duration > 0 {
		lifetime = lt.Duration
	}
	// coderd caps token lifetimes (168h unless configured otherwise);
	// ask for no more than it allows.
	if cfg, err := owner.GetTokenConfig(ctx, user.ID.String()); err == nil && cfg.MaxTokenLifetime > 0 && lifetime > cfg.MaxTokenLifetime {
		lifetime = cfg.MaxTokenLifetime
	}
	name := tokenName(ccp)
	key, err := owner.CreateToken(ctx, user.ID.String(), codersdk.CreateTokenRequest{TokenName: name, Lifetime: lifetime})
	if err != nil {
		*res = m.apiError(*res, "create the operator token", err)
		return nil, nil
	}
	apiKey, err := owner.APIKeyByName(ctx, user.ID.String(), name)
	if err != nil {
		*res = m.apiError(*res, "read the operator token", err)
		return nil, nil
	}

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: coderapi.TokenSecretName(ccp.Name), Namespace: ccp.Namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, m.Client, secret, func() error {
		secret.Labels = coderapi.OperatorSecretLabels(ccp.Name)
		secret.Annotations = map[string]string{
			annotationTokenName: name,
			annotationTokenID:   apiKey.ID,
			annotationExpiresAt: apiKey.ExpiresAt.UTC().Format(time.RFC3339),
			annotationLifetime:  strconv.FormatInt(apiKey.LifetimeSeconds, 10),
			annotationCoderURL:  u.String(),
		}
		secret.Type = corev1.SecretTypeOpaque
		secret.Data = map[string][]byte{coderapi.TokenKey: []byte(key.Key)}
		return controllerutil.SetControllerReference(ccp, secret, m.Client.Scheme())
	})
	if err != nil {
		return nil, fmt.Errorf("store operator token in Secret %s: %w", secret.Name, err)
	}

	// The replaced token is revoked only once its successor is stored, so
	// a failure in between never leaves the operator without a token.
	if old != nil && old.Annotations[annotationTokenID] != "" && old.Annotations[annotationCoderURL] == u.String() {
		if err := owner.DeleteAPIKey(ctx, user.ID.String(), old.Annotations[annotationTokenID]); err != nil &&
			!coderapi.IsNotFound(err) {
			logf.FromContext(ctx).Info("could not revoke the replaced operator token", "error", coderapi.Message(err))
		}
	}
	return secret, nil
}

// ownerClient returns a client acting as an owner of coderd: the first
// user the operator creates on a fresh coderd, or the owner token or
// credentials the user supplied.
func (m *Manager) ownerClient(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, res *Result) (*codersdk.Client, bool, error) {
	anon := coderapi.NewClient(u, "", m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(anon)
	hasFirst, err := anon.HasFirstUser(ctx)
	if err != nil {
		*res = m.apiError(*res, "check for a first user", err)
		return nil, false, nil
	}
	access := ccp.Spec.OperatorAccess
	switch {
	case !hasFirst:
		return m.createFirstUser(ctx, ccp, u, anon, res)
	case access.OwnerTokenSecretRef != nil:
		ref := access.OwnerTokenSecretRef
		s, err := m.getSecret(ctx, ccp.Namespace, ref.Name)
		if err != nil {
			return nil, false, err
		}
		if s == nil || len(s.Data[ref.Key]) == 0 {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerSecretMissing,
				Message: fmt.Sprintf("Secret %s with key %q (spec.operatorAccess.ownerTokenSecretRef) not found", ref.Name, ref.Key)}
			return nil, false, nil
		}
		return coderapi.NewClient(u, string(s.Data[ref.Key]), m.timeout(), m.target(ccp)), true, nil
	}

	// Credentials: the user's, or those of the first user the operator
	// created earlier.
	name := AdminSecretName(ccp)
	field := "the first user the operator created"
	if ref := access.OwnerCredentialsSecretRef; ref != nil {
		name, field = ref.Name, "spec.operatorAccess.ownerCredentialsSecretRef"
	}
	s, err := m.getSecret(ctx, ccp.Namespace, name)
	if err != nil {
		return nil, false, err
	}
	if s == nil {
		if access.OwnerCredentialsSecretRef != nil {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerSecretMissing,
				Message: fmt.Sprintf("Secret %s (%s) not found", name, field)}
		} else {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerCredentialsRequired,
				Message: "coderd already has users: set spec.operatorAccess.ownerTokenSecretRef or ownerCredentialsSecretRef"}
		}
		return nil, false, nil
	}
	c := coderapi.NewClient(u, "", m.timeout(), m.target(ccp))
	login, err := c.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{
		Email: string(s.Data["email"]), Password: string(s.Data["password"]),
	})
	if err != nil {
		if code := coderapi.StatusCode(err); code == http.StatusUnauthorized || code == http.StatusBadRequest {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerCredentialsRejected,
				Message: fmt.Sprintf("coderd rejected the credentials in Secret %s (%s): %s", name, field, coderapi.Message(err))}
			return nil, false, nil
		}
		*res = m.apiError(*res, "log in as owner", err)
		return nil, false, nil
	}
	c.SetSessionToken(login.SessionToken)
	return c, true, nil
}

// createFirstUser performs coderd's first-user setup and keeps the
// credentials in a Secret an admin can read to log in. The Secret has no
// owner reference: it is the only copy of that password, and the coderd
// may outlive the control plane object.
func (m *Manager) createFirstUser(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, anon *codersdk.Client, res *Result) (*codersdk.Client, bool, error) {
	email, username := "admin@coder-k8s.invalid", "admin"
	password, err := randomPassword()
	if err != nil {
		return nil, false, err
	}
	// Store the credentials first: if coderd accepts them and the process
	// dies before they are written, nobody could ever log in as that user.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: AdminSecretName(ccp), Namespace: ccp.Namespace,
			Labels: coderapi.OperatorSecretLabels(ccp.Name),
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"email": []byte(email), "username": []byte(username), "password": []byte(password), "url": []byte(u.String())},
	}
	if err := m.Client.Create(ctx, secret); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, fmt.Errorf("store first user credentials in Secret %s: %w", secret.Name, err)
		}
		// A previous attempt stored credentials; reuse them.
		existing, err := m.getSecret(ctx, ccp.Namespace, secret.Name)
		if err != nil || existing == nil {
			return nil, false, fmt.Errorf("read Secret %s: %w", secret.Name, err)
		}
		email, username, password = string(existing.Data["email"]), string(existing.Data["username"]), string(existing.Data["password"])
	}
	if _, err := anon.CreateFirstUser(ctx, codersdk.CreateFirstUserRequest{
		Email: email, Username: username, Name: "Administrator", Password: password,
	}); err != nil {
		*res = m.apiError(*res, "create the first user", err)
		return nil, false, nil
	}
	m.event(ccp, corev1.EventTypeNormal, "FirstUserCreated", "Created coderd's first user; credentials are in Secret "+secret.Name)
	login, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: email, Password: password})
	if err != nil {
		*res = m.apiError(*res, "log in as the first user", err)
		return nil, false, nil
	}
	c := coderapi.NewClient(u, login.SessionToken, m.timeout(), m.target(ccp))
	return c, true, nil
}

// applyLicense uploads spec.license once per distinct license.
func (m *Manager) applyLicense(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, c *codersdk.Client, tokenSecret *corev1.Secret) (*LicenseResult, error) {
	ref := ccp.Spec.License.SecretRef
	s, err := m.getSecret(ctx, ccp.Namespace, ref.Name)
	if err != nil {
		return nil, err
	}
	if s == nil || len(s.Data[ref.Key]) == 0 {
		return &LicenseResult{Reason: coderv1alpha1.ReasonLicenseSecretMissing, Message: fmt.Sprintf("Secret %s with key %q (spec.license.secretRef) not found", ref.Name, ref.Key)}, nil
	}
	sum := sha256.Sum256(s.Data[ref.Key])
	digest := hex.EncodeToString(sum[:])
	if tokenSecret.Annotations[annotationLicense] == digest {
		return &LicenseResult{Applied: true, Reason: coderv1alpha1.ReasonLicenseUploaded, Message: "the license is installed"}, nil
	}
	if _, err := c.AddLicense(ctx, codersdk.AddLicenseRequest{License: string(s.Data[ref.Key])}); err != nil {
		if reason, ok := coderapi.FeatureUnavailable(err); ok {
			return &LicenseResult{Reason: reason, Message: "coderd cannot take a license: " + coderapi.Message(err)}, nil
		}
		return &LicenseResult{Reason: coderv1alpha1.ReasonLicenseRejected, Message: "coderd rejected the license: " + coderapi.Message(err)}, nil
	}
	patch := client.MergeFrom(tokenSecret.DeepCopy())
	if tokenSecret.Annotations == nil {
		tokenSecret.Annotations = map[string]string{}
	}
	tokenSecret.Annotations[annotationLicense] = digest
	if err := m.Client.Patch(ctx, tokenSecret, patch); err != nil {
		return nil, fmt.Errorf("record the uploaded license: %w", err)
	}
	m.event(ccp, corev1.EventTypeNormal, "LicenseUploaded", "Uploaded the license from Secret "+ref.Name)
	return &LicenseResult{Applied: true, Reason: coderv1alpha1.ReasonLicenseUploaded, Message: "the license is installed"}, nil
}

func entitlements(ctx context.Context, c *codersdk.Client) *coderv1alpha1.EntitlementsStatus {
	e, err := c.Entitlements(ctx)
	if err != nil {
		return nil
	}
	out := &coderv1alpha1.EntitlementsStatus{HasLicense: e.HasLicense, Trial: e.Trial}
	for name, f := range e.Features {
		if f.Enabled && f.Entitlement != codersdk.EntitlementNotEntitled {
			out.Features = append(out.Features, string(name))
		}
	}
	sort.Strings(out.Features)
	return out
}

func (m *Manager) apiError(res Result, action string, err error) Result {
	msg := fmt.Sprintf("%s: %s", action, coderapi.Message(err))
	if code := coderapi.StatusCode(err); code != 0 {
		msg = fmt.Sprintf("%s (HTTP %d)", msg, code)
	}
	return Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonCoderAPIError, Message: msg, RequeueAfter: retryUnreachable}
}

func (m *Manager) getSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	reader := m.APIReader
	if reader == nil {
		reader = m.Client
	}
	var s corev1.Secret
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read Secret %s/%s: %w", namespace, name, err)
	}
	return &s, nil
}

func (m *Manager) event(ccp *coderv1alpha1.CoderControlPlane, typ, reason, msg string) {
	if m.Recorder != nil {
		m.Recorder.Eventf(ccp, nil, typ, reason, "OperatorAccess", "%s", msg)
	}
}

// target labels the metrics of the clients acting on ccp.
func (m *Manager) target(ccp *coderv1alpha1.CoderControlPlane) coderapi.Target {
	return coderapi.ForControlPlaneTarget(ccp.Namespace, ccp.Name, metrics.ComponentController)
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return coderapi.DefaultTimeout
}

func (m *Manager) validateEvery() time.Duration {
	if m.ValidateEvery > 0 {
		return m.ValidateEvery
	}
	return defaultValidateEvery
}

// The last good result per control plane, so that reconciles triggered by
// other changes (a Deployment's status) do not call coderd each time.
type cacheEntry struct {
	at            time.Time
	secretVersion string
	generation    int64
	result        Result
}

func (m *Manager) cached(ccp *coderv1alpha1.CoderControlPlane, secret *corev1.Secret) (Result, bool) {
	if secret == nil {
		return Result{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.cache()[ccp.UID]
	if !ok || e.secretVersion != secret.ResourceVersion || e.generation != ccp.Generation {
		return Result{}, false
	}
	left := m.validateEvery() - time.Since(e.at)
	if left <= 0 {
		return Result{}, false
	}
	r := e.result
	r.RequeueAfter = left
	return r, true
}

func (m *Manager) remember(ccp *coderv1alpha1.CoderControlPlane, secret *corev1.Secret, r Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cache()[ccp.UID] = cacheEntry{at: time.Now(), secretVersion: secret.ResourceVersion, generation: ccp.Generation, result: r}
}

// Recheck makes the next Reconcile of ccp check its token with coderd
// instead of trusting the last check.
func (m *Manager) Recheck(ccp *coderv1alpha1.CoderControlPlane) { m.forget(ccp) }

func (m *Manager) forget(ccp *coderv1alpha1.CoderControlPlane) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cache(), ccp.UID)
}

func (m *Manager) cache() map[types.UID]cacheEntry {
	if m.results == nil {
		m.results = map[types.UID]cacheEntry{}
	}
	return m.results
}

func hasRole(u codersdk.User, role string) bool {
	for _, r := range u.Roles {
		if r.Name == role {
			return true
		}
	}
	return false
}

// tokenName is unique per control plane and per issue, within coderd's
// limits for token names (lowercase letters, digits, dashes).
func tokenName(ccp *coderv1alpha1.CoderControlPlane) string {
	sum := sha256.Sum256([]byte(ccp.Namespace + "/" + ccp.Name))
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	return "k8s-" + hex.EncodeToString(sum[:4]) + "-" + hex.EncodeToString(suffix)
}

func randomPassword() (string, error) {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", errors.New("generate first user password: " + err.Error())
	}
	return "Ck8s-" + hex.EncodeToString(b), nil
}
