package operatoraccess

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// annotationLicense, on the token Secret, is the SHA-256 of the license
// last uploaded, so that each license is uploaded once.
const annotationLicense = "coder.com/license-sha256"

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
