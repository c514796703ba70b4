package controlplane

import (
	"context"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes/status,verbs=get;patch
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Notes on the RBAC above:
//   - Secrets: only metadata is watched and read (existence of the Secrets
//     the pods mount); Kubernetes RBAC cannot grant metadata alone.
//   - Roles: only to delete the workspace Roles earlier versions created
//     (labelled as the control plane's children). The operator creates no
//     Roles and holds neither escalate nor bind here: workspace RBAC binds
//     ClusterRoles an administrator installed, and the chart grants bind
//     on exactly the ClusterRoles of controller.workspaceRBAC, by name
//     (a rule no marker can express, as the names are the chart's).
//   - codercontrolplanes/finalizers: owner references with
//     blockOwnerDeletion need it where the OwnerReferencesPermissionEnforcement
//     admission plugin is on.

// SetupWithManager registers the reconciler with mgr.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Access == nil {
		return errors.New("codercontrolplane controller: no access manager")
	}
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Scheme == nil {
		r.Scheme = mgr.GetScheme()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder("codercontrolplane-controller")
	}
	r.routeReader = mgr.GetCache()

	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &coderv1alpha1.CoderControlPlane{}, secretIndex,
		func(o client.Object) []string {
			ccp, ok := o.(*coderv1alpha1.CoderControlPlane)
			if !ok {
				return nil
			}
			return watchedSecrets(ccp)
		}); err != nil {
		return fmt.Errorf("index control planes by Secret: %w", err)
	}

	b := ctrl.NewControllerManagedBy(mgr).
		Named("codercontrolplane").
		// Status writes (ours included) and metadata changes do not
		// bump the generation and need no reconcile; deletion does.
		For(&coderv1alpha1.CoderControlPlane{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Children: any change, status included (Deployment
		// availability), reconciles the owner.
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&networkingv1.Ingress{}).
		// The workspace RoleBindings (and the Roles of earlier versions,
		// to prune) live also in other namespaces, where owner
		// references cannot point to the control plane: map them back
		// by label (same namespace too).
		Watches(&rbacv1.Role{}, handler.EnqueueRequestsFromMapFunc(mapByLabels)).
		Watches(&rbacv1.RoleBinding{}, handler.EnqueueRequestsFromMapFunc(mapByLabels)).
		// Secrets: metadata only, and only the operator's own (the cache
		// selects by label, package kubecache), so that a deleted token
		// Secret is replaced at once. Users' Secrets are not watched:
		// they are read uncached, a missing one again every
		// missingSecretRecheck.
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.mapSecret)).
		WithOptions(controller.Options{MaxConcurrentReconciles: valueOr(r.MaxConcurrentReconciles, DefaultMaxConcurrentReconciles)})
	// HTTPRoutes are watched only if the Gateway API is installed when
	// the operator starts (a watch on a missing kind would keep the
	// controller from starting). Installed later, routes are still
	// created; drift is then corrected at the next reconcile.
	if installed, err := r.httpRouteInstalled(); err != nil {
		return err
	} else if installed {
		b = b.Owns(newHTTPRoute())
	}
	if r.Rechecks != nil {
		b = b.WatchesRawSource(source.TypedChannel(r.Rechecks, handler.TypedFuncs[types.NamespacedName, ctrl.Request]{
			GenericFunc: r.recheck,
		}))
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("codercontrolplane controller: %w", err)
	}
	return nil
}

// mapByLabels maps a child in any namespace to its control plane.
func mapByLabels(_ context.Context, o client.Object) []ctrl.Request {
	l := o.GetLabels()
	if l[coderv1alpha1.LabelManagedBy] != coderv1alpha1.ManagedByValue || l[coderv1alpha1.LabelControlPlane] == "" || l[coderv1alpha1.LabelControlPlaneNamespace] == "" {
		return nil
	}
	return []ctrl.Request{{NamespacedName: types.NamespacedName{Namespace: l[coderv1alpha1.LabelControlPlaneNamespace], Name: l[coderv1alpha1.LabelControlPlane]}}}
}

// mapSecret maps a Secret to the control planes in its namespace that
// reference it.
func (r *Reconciler) mapSecret(ctx context.Context, o client.Object) []ctrl.Request {
	var list coderv1alpha1.CoderControlPlaneList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretIndex: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list control planes referencing Secret", "secret", client.ObjectKeyFromObject(o))
		return nil
	}
	reqs := make([]ctrl.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// recheck drops the access manager's last result for the control plane
// named by e and reconciles it, so its token is checked with coderd now.
func (r *Reconciler) recheck(ctx context.Context, e event.TypedGenericEvent[types.NamespacedName], q workqueue.TypedRateLimitingInterface[ctrl.Request]) {
	key := e.Object
	var ccp coderv1alpha1.CoderControlPlane
	if err := r.Client.Get(ctx, key, &ccp); err != nil {
		// Gone, or not in the cache yet: nothing to recheck.
		return
	}
	if rc, ok := r.Access.(Rechecker); ok {
		rc.Recheck(&ccp)
	}
	logf.FromContext(ctx).Info("coderd rejected the operator token: checking operator access now", "controlPlane", key)
	q.Add(ctrl.Request{NamespacedName: key})
}
