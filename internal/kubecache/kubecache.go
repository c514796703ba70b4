// Package kubecache decides what the shared controller-runtime cache of
// the manager holds: only what coder-k8s owns. The composition root
// (internal/app) and the controllers' tests build their managers with it,
// so the tests run with the same selection as the product.
//
// Without it a manager caches every object of every kind it reads or
// watches, cluster-wide: every Deployment, Service, ServiceAccount,
// Ingress, Role and RoleBinding, and, through the Secret metadata
// watches, every Secret's metadata including the
// kubectl.kubernetes.io/last-applied-configuration annotation, which
// holds the whole Secret (data included) when it was created with
// `kubectl apply`.
package kubecache

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// LastAppliedAnnotation is where `kubectl apply` (client-side) keeps the
// object it last applied, data included.
const LastAppliedAnnotation = corev1.LastAppliedConfigAnnotation

// Selector selects what coder-k8s creates: every child of every kind
// carries app.kubernetes.io/managed-by=coder-k8s (Deployments, Services,
// ServiceAccounts, Ingresses, HTTPRoutes, Roles, RoleBindings and the
// Secrets it writes).
func Selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{coderv1alpha1.LabelManagedBy: coderv1alpha1.ManagedByValue})
}

// Options returns the manager's cache options:
//
//   - every kind is listed and watched with Selector (the cache's default
//     label selector, so a kind added to a watch later is selected too,
//     HTTPRoutes included, which cannot be named in ByObject while their
//     CRD may be missing);
//   - except the kinds coder-k8s reads whole: its own CRDs, which users
//     create, Namespaces (the aggregated API checks whether one is
//     terminating) and the cluster's admission configuration (webhook
//     configurations, validating admission policies and their bindings,
//     which the aggregated API's admission chain runs; see
//     Admission);
//   - every cached object loses its managedFields and last-applied
//     annotation (Strip).
//
// A user who can label objects can still put objects of their own into
// the cache (metadata only for Secrets, see ClientOptions); what they add
// is bounded by what they may create, and no Secret data is read through
// this cache.
func Options() cache.Options {
	whole := cache.ByObject{Label: labels.Everything()}
	byObject := map[client.Object]cache.ByObject{
		&coderv1alpha1.CoderControlPlane{}:   whole,
		&coderv1alpha1.CoderProvisioner{}:    whole,
		&coderv1alpha1.CoderWorkspaceProxy{}: whole,
	}
	for _, obj := range Admission() {
		byObject[obj] = whole
	}
	return cache.Options{
		DefaultLabelSelector: Selector(),
		ByObject:             byObject,
		DefaultTransform:     Strip,
	}
}

// Admission are the kinds the aggregated API's admission chain reads
// through this cache, which holds them whole: Namespaces (also for the
// aggregated API's backends) and the cluster's admission configuration.
// Not the mutating admission policies: the cache refuses to start with a
// kind the cluster does not serve (they are served from 1.36 on), so
// admission watches those itself where they are served.
func Admission() []client.Object {
	return []client.Object{
		&corev1.Namespace{},
		&admissionregistrationv1.MutatingWebhookConfiguration{},
		&admissionregistrationv1.ValidatingWebhookConfiguration{},
		&admissionregistrationv1.ValidatingAdmissionPolicy{},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{},
	}
}

// ClientOptions returns the options of the manager's client: Secrets
// (whole or metadata), pods and events are always read from the API
// server, never through the cache. A cached read would start an informer
// holding the data of every selected Secret; the Secrets the operator
// reads are few and read rarely (on reconcile). Pods and events are read
// for one workspace or coderd at a time (a GET of a workspace whose agent
// is not ready, first-user setup), with get and list only: an informer
// would need watch on every pod and event of the cluster.
func ClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}, &corev1.Pod{}, &corev1.Event{}}}}
}

// Strip drops what no coder-k8s code reads from an object about to enter
// a cache: managedFields (the apply history, often larger than the
// object) and the last-applied annotation. Server-side apply and merge
// patches do not need either; no cached object is written back whole.
func Strip(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil {
		// Not an object (a tombstone): nothing to strip.
		return in, nil
	}
	if obj.GetManagedFields() != nil {
		obj.SetManagedFields(nil)
	}
	if ann := obj.GetAnnotations(); ann != nil {
		if _, ok := ann[LastAppliedAnnotation]; ok {
			delete(ann, LastAppliedAnnotation)
			if len(ann) == 0 {
				ann = nil
			}
			obj.SetAnnotations(ann)
		}
	}
	return in, nil
}

var _ toolscache.TransformFunc = Strip
