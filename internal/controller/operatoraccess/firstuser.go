package operatoraccess

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// AdminSecretName is the Secret holding the first user's credentials when
// the operator created that user.
func AdminSecretName(ccp *coderv1alpha1.CoderControlPlane) string {
	return ccp.Name + "-admin"
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
		if err != nil {
			return nil, false, err
		}
		if existing == nil {
			return nil, false, fmt.Errorf("first user credentials Secret %s/%s was deleted while being read", ccp.Namespace, secret.Name)
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

// randomPassword is the first user's password: random, and within
// coderd's password rules.
func randomPassword() (string, error) {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate first user password: %w", err)
	}
	return "Ck8s-" + hex.EncodeToString(b), nil
}
