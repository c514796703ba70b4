package operatoraccess

import (
	"context"
	"fmt"
	"net/http"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// release ends the use of an owner client; issued says whether the
// operator got its token with it.
type release func(issued bool)

// ownerClient returns a client acting as an owner of coderd: the first
// user the operator creates on a fresh coderd, or the owner token or
// credentials the user supplied, each only if bound to at.url
// (bindCredentials). When there is none it fills res with the reason and
// returns a nil client. The caller must call the release function: it
// logs out the session the operator opened with a password.
func (m *Manager) ownerClient(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, res *Result) (*codersdk.Client, release, error) {
	anon := coderapi.NewClient(at.dial, "", m.timeout(), m.target(ccp))
	defer coderapi.CloseIdle(anon)
	hasFirst, err := anon.HasFirstUser(ctx)
	if err != nil {
		*res = m.apiError(*res, "check for a first user", err)
		return nil, nil, nil
	}
	access := ccp.Spec.OperatorAccess
	switch {
	case !hasFirst:
		return m.createFirstUser(ctx, ccp, at, anon, res)
	case access.OwnerTokenSecretRef != nil:
		ref := access.OwnerTokenSecretRef
		s, err := m.getSecret(ctx, ccp.Namespace, ref.Name)
		if err != nil {
			return nil, nil, err
		}
		if s == nil || len(s.Data[ref.Key]) == 0 {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerSecretMissing,
				Message: fmt.Sprintf("Secret %s with key %q (spec.operatorAccess.ownerTokenSecretRef) not found", ref.Name, ref.Key)}
			return nil, nil, nil
		}
		if ok, err := m.bindCredentials(ctx, ccp, at, s, "spec.operatorAccess.ownerTokenSecretRef", false, res); err != nil || !ok {
			return nil, nil, err
		}
		c := coderapi.NewClient(at.dial, string(s.Data[ref.Key]), m.timeout(), m.target(ccp))
		// The user's token is theirs: it is not logged out.
		return c, func(bool) { coderapi.CloseIdle(c) }, nil
	}

	// Credentials: the user's, or those of the first user the operator
	// created earlier.
	name := AdminSecretName(ccp)
	field := "the first user the operator created"
	admin := access.OwnerCredentialsSecretRef == nil
	if !admin {
		name, field = access.OwnerCredentialsSecretRef.Name, "spec.operatorAccess.ownerCredentialsSecretRef"
	}
	s, err := m.getSecret(ctx, ccp.Namespace, name)
	if err != nil {
		return nil, nil, err
	}
	if s == nil {
		if !admin {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerSecretMissing,
				Message: fmt.Sprintf("Secret %s (%s) not found", name, field)}
		} else {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerCredentialsRequired,
				Message: "coderd already has users: set spec.operatorAccess.ownerTokenSecretRef or ownerCredentialsSecretRef"}
		}
		return nil, nil, nil
	}
	if ok, err := m.bindCredentials(ctx, ccp, at, s, field, admin, res); err != nil || !ok {
		return nil, nil, err
	}
	session, err := m.login(ctx, ccp, at, anon, s, admin)
	if err != nil {
		if code := coderapi.StatusCode(err); code == http.StatusUnauthorized || code == http.StatusBadRequest {
			*res = Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonOwnerCredentialsRejected,
				Message: fmt.Sprintf("coderd rejected the credentials in Secret %s (%s): %s", name, field, coderapi.Message(err))}
			return nil, nil, nil
		}
		*res = m.apiError(*res, "log in as owner", err)
		return nil, nil, nil
	}
	return session, m.endSession(ctx, ccp, session, s, admin), nil
}

// login opens a session with the email and password in s. For the first
// user's Secret it also tries a password whose rotation was interrupted
// (adminPasswordNextKey), and completes that rotation when it works.
func (m *Manager) login(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, anon *codersdk.Client, s *corev1.Secret, admin bool) (*codersdk.Client, error) {
	email := string(s.Data["email"])
	login, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: email, Password: string(s.Data["password"])})
	if err != nil && admin && len(s.Data[adminPasswordNextKey]) > 0 && coderapi.StatusCode(err) == http.StatusUnauthorized {
		next := string(s.Data[adminPasswordNextKey])
		if l, nerr := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: email, Password: next}); nerr == nil {
			login, err = l, nil
			if perr := m.storeRotatedPassword(ctx, s, next); perr != nil {
				logf.FromContext(ctx).Info("could not complete an interrupted password rotation", "secret", s.Name, "error", perr.Error())
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return coderapi.NewClient(at.dial, login.SessionToken, m.timeout(), m.target(ccp)), nil
}

// endSession returns the release of a password session: the first user's
// password is rotated once after the operator got its token (which ends
// every session of that user, this one included); any other session is
// logged out, so that no session the operator opened outlives its use.
func (m *Manager) endSession(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, session *codersdk.Client, s *corev1.Secret, admin bool) release {
	return func(issued bool) {
		defer coderapi.CloseIdle(session)
		if admin && issued && s.Annotations[annotationPasswordRotated] == "" {
			err := m.rotateAdminPassword(ctx, ccp, session, s)
			if err == nil {
				return
			}
			logf.FromContext(ctx).Info("could not rotate the first user's password; will retry at its next use", "secret", s.Name, "error", err.Error())
		}
		if err := session.Logout(ctx); err != nil && !coderapi.IsUnauthorized(err) {
			logf.FromContext(ctx).Info("could not log out the owner session", "secret", s.Name, "error", coderapi.Message(err))
		}
	}
}
