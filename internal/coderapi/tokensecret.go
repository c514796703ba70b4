package coderapi

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// The operator token Secret is the contract between the controller that
// writes it (internal/controller/operatoraccess, one per control plane,
// in the control plane's namespace) and the components that act as the
// operator with it (ForControlPlane, the aggregated API server's
// backends). Both sides take its name, key and labels from here.

// TokenKey is the key of the operator token in its Secret.
const TokenKey = "token"

// TokenSecretName is the Secret holding the operator token of the control
// plane named controlPlane.
func TokenSecretName(controlPlane string) string { return controlPlane + "-operator-token" }

// OperatorSecretLabels are the labels of the Secrets the operator writes
// for the control plane named controlPlane: its token Secret and, when
// the operator created coderd's first user, that user's credentials.
func OperatorSecretLabels(controlPlane string) map[string]string {
	return map[string]string{
		coderv1alpha1.LabelManagedBy:    coderv1alpha1.ManagedByValue,
		coderv1alpha1.LabelControlPlane: controlPlane,
	}
}

// OperatorSecretSelector selects the Secrets labeled with
// OperatorSecretLabels, of every control plane.
func OperatorSecretSelector() (labels.Selector, error) {
	managed, err := labels.NewRequirement(coderv1alpha1.LabelManagedBy, selection.Equals, []string{coderv1alpha1.ManagedByValue})
	if err != nil {
		return nil, fmt.Errorf("operator Secret selector: %w", err)
	}
	owned, err := labels.NewRequirement(coderv1alpha1.LabelControlPlane, selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("operator Secret selector: %w", err)
	}
	return labels.NewSelector().Add(*managed, *owned), nil
}

// AnnotationCoderURL, on a Secret holding a Coder credential (the
// operator token Secret, the first user's Secret, an owner token or
// owner credentials Secret), is the coderd URL the credential was issued
// for. The credential is sent to no other URL (SameURL).
const AnnotationCoderURL = "coder.com/coder-url"

// NormalizeURL is raw reduced to what identifies a coderd: lower-case
// scheme and host, an explicit port, and the path without a trailing
// slash; query and fragment are dropped.
func NormalizeURL(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("parse coderd URL %q: %w", raw, err)
	}
	scheme := strings.ToLower(u.Scheme)
	if (scheme != "http" && scheme != "https") || u.Hostname() == "" {
		return "", fmt.Errorf("coderd URL %q: want http(s)://host[:port][/path]", raw)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + strings.TrimRight(u.EscapedPath(), "/"), nil
}

// SameURL reports whether a and b name the same coderd after
// NormalizeURL; an unparsable URL matches nothing.
func SameURL(a, b string) bool {
	na, err := NormalizeURL(a)
	if err != nil {
		return false
	}
	nb, err := NormalizeURL(b)
	return err == nil && na == nb
}
