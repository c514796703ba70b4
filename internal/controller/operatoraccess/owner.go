package operatoraccess

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/coder/coder/v2/codersdk"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// ownerClient returns a client acting as an owner of coderd: the first
// user the operator creates on a fresh coderd, or the owner token or
// credentials the user supplied. When there is none it fills res with the
// reason and returns false. The caller closes the client (CloseIdle).
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
	login, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{
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
	return coderapi.NewClient(u, login.SessionToken, m.timeout(), m.target(ccp)), true, nil
}
