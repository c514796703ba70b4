package testenv

import (
	"context"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WaitAllowed asks kube-apiserver (SubjectAccessReview) whether the
// ServiceAccount saNamespace/saName may do what rule grants (its first
// verb on its first resource, or non-resource URL), in namespace (empty:
// cluster-wide), until it may or 30 seconds have passed. kube-apiserver's
// authorizer sees a new Role or binding a moment after it is created, as
// any client of a real cluster does; a test that grants and then acts
// waits for it here.
func WaitAllowed(ctx context.Context, cs kubernetes.Interface, saNamespace, saName, namespace string, rule rbacv1.PolicyRule) error {
	user := "system:serviceaccount:" + saNamespace + ":" + saName
	spec := authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	switch {
	case len(rule.NonResourceURLs) > 0 && len(rule.Verbs) > 0:
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: rule.NonResourceURLs[0], Verb: rule.Verbs[0]}
	case len(rule.APIGroups) > 0 && len(rule.Resources) > 0 && len(rule.Verbs) > 0:
		resource, sub, _ := strings.Cut(rule.Resources[0], "/")
		attrs := &authorizationv1.ResourceAttributes{
			Namespace: namespace, Group: rule.APIGroups[0], Resource: resource, Subresource: sub, Verb: rule.Verbs[0],
		}
		if len(rule.ResourceNames) > 0 {
			attrs.Name = rule.ResourceNames[0]
		}
		spec.ResourceAttributes = attrs
	default:
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx,
			&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err == nil && sar.Status.Allowed {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("denied (%s)", sar.Status.Reason)
			}
			return fmt.Errorf("kube-apiserver does not grant %s the rule %v after 30s: %w", user, rule, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
