package operatoraccess

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// The first user's Secret: email, username and password, the URL of the
// coderd (also in coderapi.AnnotationCoderURL), and while the password is
// being rotated the new one.
const (
	adminURLKey          = "url"
	adminPasswordNextKey = "password-next"
	// annotationPasswordRotated records when the operator last replaced
	// the password it used for first-user setup.
	annotationPasswordRotated = "coder.com/password-rotated-at"
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
func (m *Manager) createFirstUser(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, anon *codersdk.Client, res *Result) (*codersdk.Client, release, error) {
	email, username := "admin@coder-k8s.invalid", "admin"
	password, err := randomPassword()
	if err != nil {
		return nil, nil, err
	}
	// Store the credentials first: if coderd accepts them and the process
	// dies before they are written, nobody could ever log in as that user.
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: AdminSecretName(ccp), Namespace: ccp.Namespace,
			Labels:      coderapi.OperatorSecretLabels(ccp.Name),
			Annotations: map[string]string{coderapi.AnnotationCoderURL: at.url},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"email": []byte(email), "username": []byte(username), "password": []byte(password), adminURLKey: []byte(at.url)},
	}
	if err := m.Client.Create(ctx, secret); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("store first user credentials in Secret %s: %w", secret.Name, err)
		}
		// A previous attempt stored credentials; reuse them, if they
		// were made for this coderd.
		existing, err := m.getSecret(ctx, ccp.Namespace, secret.Name)
		if err != nil {
			return nil, nil, err
		}
		if existing == nil {
			return nil, nil, fmt.Errorf("first user credentials Secret %s/%s was deleted while being read", ccp.Namespace, secret.Name)
		}
		if ok, err := m.bindCredentials(ctx, ccp, at, existing, "the first user the operator created", true, res); err != nil || !ok {
			return nil, nil, err
		}
		secret = existing
		email, username, password = string(existing.Data["email"]), string(existing.Data["username"]), string(existing.Data["password"])
	}
	if _, err := anon.CreateFirstUser(ctx, codersdk.CreateFirstUserRequest{
		Email: email, Username: username, Name: "Administrator", Password: password,
	}); err != nil {
		*res = m.apiError(*res, "create the first user", err)
		return nil, nil, nil
	}
	m.event(ccp, corev1.EventTypeNormal, "FirstUserCreated", "Created coderd's first user; credentials are in Secret "+secret.Name)
	session, err := m.login(ctx, ccp, at, anon, secret, true)
	if err != nil {
		*res = m.apiError(*res, "log in as the first user", err)
		return nil, nil, nil
	}
	return session, m.endSession(ctx, ccp, session, secret, true), nil
}

// rotateAdminPassword replaces the first user's password, used for setup,
// by a new one known only to the Secret. coderd deletes every API key of
// a user whose password changes, so this also ends every session of the
// first user, session's included. The new password is stored before
// coderd takes it (adminPasswordNextKey), so that a crash in between
// loses nothing: login tries it and completes the rotation.
func (m *Manager) rotateAdminPassword(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, session *codersdk.Client, s *corev1.Secret) error {
	next, err := randomPassword()
	if err != nil {
		return err
	}
	s.Data[adminPasswordNextKey] = []byte(next)
	if err := m.Client.Update(ctx, s); err != nil {
		return fmt.Errorf("store the next first user password in Secret %s: %w", s.Name, err)
	}
	if err := session.UpdateUserPassword(ctx, codersdk.Me, codersdk.UpdateUserPasswordRequest{
		OldPassword: string(s.Data["password"]), Password: next,
	}); err != nil {
		return fmt.Errorf("change the first user's password: %s", coderapi.Message(err))
	}
	if err := m.storeRotatedPassword(ctx, s, next); err != nil {
		return err
	}
	m.event(ccp, corev1.EventTypeNormal, "FirstUserPasswordRotated",
		"Replaced the first user's setup password and ended its sessions; the new password is in Secret "+s.Name)
	return nil
}

// storeRotatedPassword makes password, which coderd accepts, the one in
// the first user's Secret.
func (m *Manager) storeRotatedPassword(ctx context.Context, s *corev1.Secret, password string) error {
	s.Data["password"] = []byte(password)
	delete(s.Data, adminPasswordNextKey)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[annotationPasswordRotated] = time.Now().UTC().Format(time.RFC3339)
	if err := m.Client.Update(ctx, s); err != nil {
		return fmt.Errorf("store the rotated first user password in Secret %s: %w", s.Name, err)
	}
	return nil
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
