package operatoraccess

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// The operator token Secret's annotations: what the token is and where it
// came from, so that it can be checked, renewed and revoked without
// listing tokens in coderd.
const (
	annotationTokenName = "coder.com/token-name"
	annotationTokenID   = "coder.com/token-id"
	annotationExpiresAt = "coder.com/token-expires-at"
	annotationLifetime  = "coder.com/token-lifetime-seconds"
	// annotationReplaced lists, comma-separated, the IDs of the operator
	// tokens this one replaced that are not revoked yet, and
	// annotationRevokeAfter says from when they are revoked. Kept in the
	// Secret, not in memory, so that a restart or a new leader still
	// revokes them.
	annotationReplaced    = "coder.com/replaced-token-ids"
	annotationRevokeAfter = "coder.com/revoke-replaced-after"
)

// DefaultRevokeReplacedAfter is Manager.RevokeReplacedAfter when unset.
const DefaultRevokeReplacedAfter = 5 * time.Minute

// defaultLifetime is the operator token's lifetime when
// spec.operatorAccess.tokenLifetime is unset.
const defaultLifetime = 168 * time.Hour

// Revoke deletes the operator's token in coderd, with the tokens it
// replaced that are still in their grace period, and its Secret. A token
// coderd no longer knows counts as revoked; an unreachable coderd is an
// error, so the caller decides how long to keep trying. The token is sent
// only when coderURL is the URL it was issued for (recorded in its
// Secret): after a URL change it is sent nowhere, and a Warning event
// names the token and the coderd where an admin can revoke it.
func (m *Manager) Revoke(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) error {
	m.forget(ccp)
	secret, err := m.getSecret(ctx, ccp.Namespace, coderapi.TokenSecretName(ccp.Name))
	if err != nil || secret == nil {
		return err
	}
	issuedFor := secret.Annotations[coderapi.AnnotationCoderURL]
	if !coderapi.SameURL(issuedFor, coderURL) {
		m.event(ccp, corev1.EventTypeWarning, "OperatorTokenNotRevoked", fmt.Sprintf(
			"the operator token %s (coder user %s, expires %s) was issued by coderd at %s, not by %s (the control plane's URL): it was not sent there; revoke it in the coderd at %s if that coderd is still in use",
			secret.Annotations[annotationTokenName], OperatorUsername, secret.Annotations[annotationExpiresAt], issuedFor, coderURL, issuedFor))
	} else if u, err := url.Parse(issuedFor); err == nil && u.Host != "" {
		c := coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
		defer coderapi.CloseIdle(c)
		// Replaced tokens still in their grace period first: revoking
		// them needs the current token.
		replaced, _ := pendingRevocation(secret)
		err := deleteTokens(ctx, c, replaced)
		switch {
		case coderapi.IsUnauthorized(err):
			m.event(ccp, corev1.EventTypeWarning, "OperatorTokenNotRevoked", fmt.Sprintf(
				"the replaced operator tokens %s (coder user %s) could not be revoked: coderd refuses the current operator token; revoke them in the coderd at %s",
				strings.Join(replaced, ", "), OperatorUsername, issuedFor))
		case err != nil:
			return fmt.Errorf("coderd at %s: %w", u, err)
		}
		err = c.DeleteAPIKey(ctx, codersdk.Me, secret.Annotations[annotationTokenID])
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

// issueToken issues a new operator token with self (the operator's own,
// still valid token) when given, else, or when that fails in coderd, with
// an owner session. When no token can be issued it fills res with the
// reason and returns a nil Secret.
func (m *Manager) issueToken(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, old *corev1.Secret, res *Result, self *codersdk.Client) (*corev1.Secret, error) {
	if self != nil {
		before := *res
		secret, err := m.issueWith(ctx, ccp, at, old, res, self)
		if err != nil || secret != nil {
			return secret, err
		}
		logf.FromContext(ctx).Info("the operator token could not renew itself; using an owner session", "reason", res.Message)
		*res = before
	}
	owner, release, err := m.ownerClient(ctx, ccp, at, res)
	if err != nil || owner == nil {
		return nil, err
	}
	secret, err := m.issueWith(ctx, ccp, at, old, res, owner)
	release(secret != nil && err == nil)
	return secret, err
}

// issueWith makes sure, acting through owner, that the operator user
// exists with the owner role, creates a token for it and stores the token
// in the Secret, with the one it replaces recorded for revocation after
// a grace period.
func (m *Manager) issueWith(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, old *corev1.Secret, res *Result, owner *codersdk.Client) (*corev1.Secret, error) {
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

	// Rounded up to the second the annotation keeps, so that the grace
	// period is never shorter than configured.
	revokeAfter := time.Now().Add(m.revokeReplacedAfter()).Truncate(time.Second).Add(time.Second)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: coderapi.TokenSecretName(ccp.Name), Namespace: ccp.Namespace}}
	_, err = controllerutil.CreateOrUpdate(ctx, m.Client, secret, func() error {
		secret.Labels = coderapi.OperatorSecretLabels(ccp.Name)
		secret.Annotations = map[string]string{
			annotationTokenName: name,
			annotationTokenID:   apiKey.ID,
			annotationExpiresAt: apiKey.ExpiresAt.UTC().Format(time.RFC3339),
			annotationLifetime:  strconv.FormatInt(apiKey.LifetimeSeconds, 10),
			// Bound to the coderd's URL, not to where it was dialled.
			coderapi.AnnotationCoderURL: at.url,
		}
		// The replaced token stays valid for a grace period: the
		// aggregated API server of every replica reads this Secret
		// through its own informer, and requests already sent with the
		// old token must finish. The controller revokes it afterwards
		// (revokeReplaced).
		if ids := replacedBy(old, at.url); len(ids) > 0 {
			secret.Annotations[annotationReplaced] = strings.Join(ids, ",")
			secret.Annotations[annotationRevokeAfter] = revokeAfter.UTC().Format(time.RFC3339)
		}
		secret.Type = corev1.SecretTypeOpaque
		secret.Data = map[string][]byte{coderapi.TokenKey: []byte(key.Key)}
		return controllerutil.SetControllerReference(ccp, secret, m.Client.Scheme())
	})
	if err != nil {
		return nil, fmt.Errorf("store operator token in Secret %s: %w", secret.Name, err)
	}

	return secret, nil
}

// replacedBy returns the token IDs a token replacing old leaves to be
// revoked: old's own and those old still had pending, when old was
// issued by the coderd at coderURL (a token of another coderd is never
// sent to this one).
func replacedBy(old *corev1.Secret, coderURL string) []string {
	if old == nil || !coderapi.SameURL(old.Annotations[coderapi.AnnotationCoderURL], coderURL) {
		return nil
	}
	ids, _ := pendingRevocation(old)
	if id := old.Annotations[annotationTokenID]; id != "" && !slices.Contains(ids, id) {
		ids = append(ids, id)
	}
	return ids
}

// pendingRevocation reads the replaced tokens a token Secret records and
// when they are due (the zero time, so at once, when unreadable).
func pendingRevocation(s *corev1.Secret) ([]string, time.Time) {
	var ids []string
	for id := range strings.SplitSeq(s.Annotations[annotationReplaced], ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	after, _ := time.Parse(time.RFC3339, s.Annotations[annotationRevokeAfter])
	return ids, after
}

// revokeReplaced revokes, with the operator's current token, the tokens
// it replaced once their grace period is over, and clears the record. It
// returns how long until the next pending revocation is due (0 when none
// is left).
func (m *Manager) revokeReplaced(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, u *url.URL, secret *corev1.Secret) (time.Duration, error) {
	ids, after := pendingRevocation(secret)
	if len(ids) == 0 {
		return 0, nil
	}
	if left := time.Until(after); left > 0 {
		return left, nil
	}
	c := coderapi.NewClient(u, string(secret.Data[coderapi.TokenKey]), m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(c)
	return 0, m.revokeReplacedWith(ctx, ccp, c, secret)
}

// revokeReplacedWith revokes the replaced tokens secret records, acting
// as the operator through c, and removes the record from the Secret
// (updated in place).
func (m *Manager) revokeReplacedWith(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, c *codersdk.Client, secret *corev1.Secret) error {
	ids, _ := pendingRevocation(secret)
	if len(ids) == 0 {
		return nil
	}
	if err := deleteTokens(ctx, c, ids); err != nil {
		return err
	}
	patch := client.MergeFromWithOptions(secret.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(secret.Annotations, annotationReplaced)
	delete(secret.Annotations, annotationRevokeAfter)
	if err := m.Client.Patch(ctx, secret, patch); err != nil {
		return fmt.Errorf("clear the revoked tokens from Secret %s: %w", secret.Name, err)
	}
	m.event(ccp, corev1.EventTypeNormal, "OperatorTokenRevoked",
		fmt.Sprintf("Revoked the replaced operator token %s once every reader had switched to its successor", strings.Join(ids, ", ")))
	return nil
}

// deleteTokens revokes the operator's own tokens ids through c, the
// operator's session. A token coderd no longer knows (expired, or
// revoked by an admin) needs nothing more.
func deleteTokens(ctx context.Context, c *codersdk.Client, ids []string) error {
	for _, id := range ids {
		if err := c.DeleteAPIKey(ctx, codersdk.Me, id); err != nil && !coderapi.IsNotFound(err) {
			return fmt.Errorf("revoke replaced operator token %s: %w", id, err)
		}
	}
	return nil
}

func (m *Manager) revokeReplacedAfter() time.Duration {
	if m.RevokeReplacedAfter > 0 {
		return m.RevokeReplacedAfter
	}
	return DefaultRevokeReplacedAfter
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
