package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// keepSet names the children that should exist, by kind, namespace and
// name; prune deletes the control plane's other children.
type keepSet map[string]bool

func keepKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

func (k keepSet) add(obj client.Object) {
	k[keepKey(obj.GetObjectKind().GroupVersionKind().Kind, obj.GetNamespace(), obj.GetName())] = true
}

func (k keepSet) has(kind string, obj client.Object) bool {
	return k != nil && k[keepKey(kind, obj.GetNamespace(), obj.GetName())]
}

// prune deletes the children of ccp that are not in keep: those of a part
// of the spec that was removed (expose, workspace RBAC, a created service
// account, extra namespaces), or all of them when the control plane
// switched to spec.externalURL. Lists come from the cache; an object the
// cache has not seen yet is pruned at a later reconcile, which its watch
// event triggers.
func (r *Reconciler) prune(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, keep keepSet) error {
	sel := client.MatchingLabels(ownedSelector(ccp))
	inNS := client.InNamespace(ccp.Namespace)
	lists := []struct {
		kind  string
		list  client.ObjectList
		opts  []client.ListOption
		owned bool
	}{
		{"Deployment", &appsv1.DeploymentList{}, []client.ListOption{inNS, sel}, true},
		{"Service", &corev1.ServiceList{}, []client.ListOption{inNS, sel}, true},
		{"ServiceAccount", &corev1.ServiceAccountList{}, []client.ListOption{inNS, sel}, true},
		{"Ingress", &networkingv1.IngressList{}, []client.ListOption{inNS, sel}, true},
		// All namespaces: the extra namespaces of workspace RBAC. Roles
		// are only those earlier versions created, all pruned.
		{"Role", &rbacv1.RoleList{}, []client.ListOption{sel}, false},
		{"RoleBinding", &rbacv1.RoleBindingList{}, []client.ListOption{sel}, false},
	}
	for _, l := range lists {
		if err := r.pruneList(ctx, r.Client, ccp, l.kind, l.list, l.opts, keep, l.owned); err != nil {
			return err
		}
	}
	installed, err := r.httpRouteInstalled()
	if err != nil || !installed {
		// Without the kind there is no route to prune.
		return nil
	}
	routes := &unstructured.UnstructuredList{}
	routes.SetGroupVersionKind(httpRouteGVK.GroupVersion().WithKind(httpRouteGVK.Kind + "List"))
	return r.pruneList(ctx, r.routeReader, ccp, httpRouteGVK.Kind, routes, []client.ListOption{inNS, sel}, keep, true)
}

// deleteWorkspaceRBAC deletes the workspace Roles and RoleBindings of ccp
// in every namespace except those in keep (all when keep is nil). It
// lists from the API server: it runs before a finalizer is removed, when
// a missed object would leak.
func (r *Reconciler) deleteWorkspaceRBAC(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, keep keepSet) error {
	reader := r.apiReader()
	sel := client.MatchingLabels(ownedSelector(ccp))
	if err := r.pruneList(ctx, reader, ccp, "Role", &rbacv1.RoleList{}, []client.ListOption{sel}, keep, false); err != nil {
		return err
	}
	return r.pruneList(ctx, reader, ccp, "RoleBinding", &rbacv1.RoleBindingList{}, []client.ListOption{sel}, keep, false)
}

func (r *Reconciler) pruneList(ctx context.Context, reader client.Reader, ccp *coderv1alpha1.CoderControlPlane, kind string, list client.ObjectList, opts []client.ListOption, keep keepSet, owned bool) error {
	if err := reader.List(ctx, list, opts...); err != nil {
		if apimeta.IsNoMatchError(err) {
			return nil
		}
		return fmt.Errorf("list %ss of control plane %s/%s: %w", kind, ccp.Namespace, ccp.Name, err)
	}
	return apimeta.EachListItem(list, func(o runtime.Object) error {
		obj, ok := o.(client.Object)
		if !ok || keep.has(kind, obj) || !owner(ccp).Manages(obj) {
			return nil
		}
		uid := obj.GetUID()
		// The UID precondition keeps a recreated object of the same
		// name, which the cache may not have seen yet, from being
		// deleted.
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
		return nil
	})
}

// gatewayAPI remembers whether the HTTPRoute kind exists, so that a
// cluster without the Gateway API is not asked on every reconcile.
type gatewayAPI struct {
	mu        sync.Mutex
	installed bool
	checked   time.Time
}

// httpRouteInstalled reports whether the cluster serves HTTPRoute
// (gateway.networking.k8s.io/v1). A positive answer is kept; a negative
// one is re-checked after GatewayAPIRecheckPeriod, so installing the
// CRDs later is noticed.
func (r *Reconciler) httpRouteInstalled() (bool, error) {
	r.gateway.mu.Lock()
	defer r.gateway.mu.Unlock()
	if r.gateway.installed || (!r.gateway.checked.IsZero() && time.Since(r.gateway.checked) < valueOr(r.GatewayAPIRecheckPeriod, gatewayAPIRecheck)) {
		return r.gateway.installed, nil
	}
	_, err := r.Client.RESTMapper().RESTMapping(httpRouteGVK.GroupKind(), httpRouteGVK.Version)
	switch {
	case err == nil:
		r.gateway.installed = true
	case apimeta.IsNoMatchError(err):
		r.gateway.installed = false
	default:
		return false, fmt.Errorf("discover %s: %w", httpRouteGVK, err)
	}
	r.gateway.checked = time.Now()
	return r.gateway.installed, nil
}

func newHTTPRoute() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(httpRouteGVK)
	return u
}
