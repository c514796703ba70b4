package operatoraccess

import (
	"context"
	"fmt"
	"net/url"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Endpoint is where the operator finds a coderd.
type Endpoint struct {
	// URL is coderd's URL (the control plane's status.url). Every
	// credential the operator holds is bound to the URL it was issued for
	// (coderapi.AnnotationCoderURL) and sent only when that is URL.
	URL string
	// Dial, when set, is the base URL the operator calls instead of URL:
	// a ready pod of a coderd the operator deployed and has not exposed
	// yet, so that first-user setup happens before anyone else can reach
	// coderd. Credentials bound to URL go there: it is the same coderd.
	Dial string
}

// coderd is an Endpoint parsed: url identifies the coderd, dial is where
// the clients connect.
type coderd struct {
	url  string
	dial *url.URL
}

// boundURL is the coderd URL the credentials in s were issued for, "" when
// s does not say. The first user's Secret written by earlier versions
// records it under the data key "url" only.
func boundURL(s *corev1.Secret, admin bool) string {
	if u := s.Annotations[coderapi.AnnotationCoderURL]; u != "" {
		return u
	}
	if admin {
		return string(s.Data[adminURLKey])
	}
	return ""
}

// bindCredentials decides whether the owner credentials in s (described
// by field, for messages) may be sent to at. Credentials bound to another
// URL are not: res then says so (CredentialsURLMismatch) and false is
// returned. Credentials bound to no URL yet are bound to at.url before
// their first use, by annotating s: from then on a change of the control
// plane's URL cannot redirect them.
func (m *Manager) bindCredentials(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, at coderd, s *corev1.Secret, field string, admin bool, res *Result) (bool, error) {
	bound := boundURL(s, admin)
	if bound == "" {
		patch := client.MergeFrom(s.DeepCopy())
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[coderapi.AnnotationCoderURL] = at.url
		if err := m.Client.Patch(ctx, s, patch); err != nil {
			return false, fmt.Errorf("bind the credentials in Secret %s to %s: %w", s.Name, at.url, err)
		}
		logf.FromContext(ctx).Info("bound owner credentials to the coderd URL", "secret", s.Name, "coderURL", at.url)
		return true, nil
	}
	if coderapi.SameURL(bound, at.url) {
		return true, nil
	}
	*res = mismatch(*res, s.Name, field, bound, at.url, admin)
	return false, nil
}

// mismatch is the result for credentials bound to another coderd. It names
// both URLs and what the admin can do, never the credentials.
func mismatch(res Result, secret, field, bound, current string, admin bool) Result {
	msg := fmt.Sprintf("the credentials in Secret %s (%s) were issued for coderd at %s, but the control plane's URL is now %s; "+
		"the operator sends them to no other coderd than their own and sent nothing to %s. "+
		"If %s is the same coderd, set the annotation %s of Secret %s to %q; ", secret, field, bound, current, current,
		current, coderapi.AnnotationCoderURL, secret, current)
	if admin {
		msg += fmt.Sprintf("if it is a coderd that already has users, reference owner credentials issued by it in spec.operatorAccess.ownerTokenSecretRef or ownerCredentialsSecretRef; "+
			"if it is a fresh coderd the operator should set up, delete Secret %s (it holds the first user's password of the coderd at %s: keep a copy)", secret, bound)
	} else {
		msg += "otherwise put owner credentials issued by it in the Secret and set that annotation, or restore the URL"
	}
	return Result{CoderVersion: res.CoderVersion, Reason: coderv1alpha1.ReasonCredentialsURLMismatch, Message: msg}
}
