// Package controlplane reconciles CoderControlPlane: it deploys coderd
// (Deployment, Service, service account, workspace RBAC, Ingress or
// HTTPRoute) or adopts an existing one (spec.externalURL), hands the
// Coder-API side to the operator access manager, and reports both in the
// status.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
)

// AccessManager is the Coder-API half of a control plane: the operator's
// user and token in coderd. *operatoraccess.Manager implements it.
type AccessManager interface {
	// Reconcile establishes or checks the operator's access to coderd at
	// coderURL and reports it.
	Reconcile(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) (operatoraccess.Result, error)
	// Revoke deletes the operator's token in coderd and its Secret.
	Revoke(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, coderURL string) error
}

var _ AccessManager = (*operatoraccess.Manager)(nil)

// Rechecker is an AccessManager that can be told a control plane's token
// may no longer work, so that its next Reconcile asks coderd instead of
// trusting its last check.
type Rechecker interface {
	Recheck(ccp *coderv1alpha1.CoderControlPlane)
}

var _ Rechecker = (*operatoraccess.Manager)(nil)

// Finalizers.
const (
	// FinalizerOperatorAccess makes deletion wait until the operator's
	// token is revoked in coderd (bounded by RevokeGracePeriod).
	FinalizerOperatorAccess = "coder.com/operator-access"
	// FinalizerWorkspaceRBAC makes deletion wait until the workspace Role
	// and RoleBinding in extra namespaces, which cannot have an owner
	// reference to the control plane, are deleted.
	FinalizerWorkspaceRBAC = "coder.com/workspace-rbac"
)

// secretIndex indexes control planes by the names of the Secrets they
// reference, to map a Secret event to the control planes that wait for it.
const secretIndex = "coder.com/referenced-secrets"

// Defaults of the Reconciler's tunables.
const (
	DefaultClusterDomain           = "cluster.local"
	DefaultAccessTimeout           = 30 * time.Second
	DefaultRevokeTimeout           = 30 * time.Second
	DefaultRevokeGracePeriod       = 5 * time.Minute
	DefaultResyncPeriod            = 10 * time.Minute
	DefaultMaxConcurrentReconciles = 4

	// gatewayAPIRecheck is how often a control plane asking for an
	// HTTPRoute checks whether the Gateway API CRDs have been installed;
	// CRDs are not watched.
	gatewayAPIRecheck = time.Minute
	minAccessBackoff  = 5 * time.Second
	maxAccessBackoff  = 5 * time.Minute
)

// Reconciler reconciles CoderControlPlane objects.
type Reconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server, where a stale cache could leak
	// objects (cleanup of other namespaces). Defaults to the manager's.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	// Recorder records events (events.k8s.io). Defaults to the manager's.
	Recorder events.EventRecorder
	// Access is the Coder-API side: operator user and token.
	Access AccessManager
	// DefaultImage runs coderd when spec.image is empty (DefaultImage).
	DefaultImage string
	// ClusterDomain is the cluster's DNS domain in in-cluster URLs.
	ClusterDomain string
	// AccessTimeout bounds Access.Reconcile, so an unreachable coderd
	// holds a worker only that long.
	AccessTimeout time.Duration
	// RevokeTimeout bounds each Access.Revoke on deletion.
	RevokeTimeout time.Duration
	// RevokeGracePeriod is how long after deletion was requested Revoke
	// is retried. After it the finalizer is removed anyway (with a
	// Warning event): a coderd that is gone for good must not keep its
	// control plane from being deleted.
	RevokeGracePeriod time.Duration
	// ResyncPeriod re-checks a control plane when the access manager asks
	// for no earlier check.
	ResyncPeriod time.Duration
	// Rechecks names control planes whose operator token another
	// component saw rejected by coderd (the aggregated API in the same
	// process): each is reconciled at once with a fresh access check.
	Rechecks <-chan event.TypedGenericEvent[types.NamespacedName]
	// MaxConcurrentReconciles lets control planes reconcile in parallel,
	// so a slow coderd delays only its own.
	MaxConcurrentReconciles int
	// GatewayAPIRecheckPeriod is how long "the HTTPRoute kind is not
	// installed" is believed before asking the API server again.
	GatewayAPIRecheckPeriod time.Duration

	gateway gatewayAPI
	// routeReader reads HTTPRoutes. They are unstructured, which the
	// manager's client does not cache; the cache does.
	routeReader client.Reader
}

// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes/status,verbs=get;patch
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles,verbs=get;list;watch;create;patch;delete;bind;escalate
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Notes on the RBAC above:
//   - Secrets: only metadata is watched and read (existence of the Secrets
//     the pods mount); Kubernetes RBAC cannot grant metadata alone.
//   - Roles: escalate and bind let the operator create the workspace Role
//     (spec.workspaceRBAC.extraRules may grant anything) and bind it
//     without holding those permissions itself, which would need far more
//     (every verb on pods cluster-wide).
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
		// The workspace Role and RoleBinding live also in other
		// namespaces, where owner references cannot point to the
		// control plane: map them back by label (same namespace too).
		Watches(&rbacv1.Role{}, handler.EnqueueRequestsFromMapFunc(mapByLabels)).
		Watches(&rbacv1.RoleBinding{}, handler.EnqueueRequestsFromMapFunc(mapByLabels)).
		// Secrets the pods mount: metadata only, so Secret data is not
		// cached cluster-wide.
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
		b = b.WatchesRawSource(source.TypedChannel(r.Rechecks, handler.TypedFuncs[types.NamespacedName, reconcile.Request]{
			GenericFunc: r.recheck,
		}))
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("codercontrolplane controller: %w", err)
	}
	return nil
}

// mapByLabels maps a child in any namespace to its control plane.
func mapByLabels(_ context.Context, o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if l[labelManagedBy] != managedByValue || l[controlPlaneLabel] == "" || l[controlPlaneNamespaceLabel] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[controlPlaneNamespaceLabel], Name: l[controlPlaneLabel]}}}
}

// mapSecret maps a Secret to the control planes in its namespace that
// reference it.
func (r *Reconciler) mapSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list coderv1alpha1.CoderControlPlaneList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretIndex: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list control planes referencing Secret", "secret", client.ObjectKeyFromObject(o))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

// Reconcile brings one control plane's children and status in line with
// its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ccp coderv1alpha1.CoderControlPlane
	if err := r.Client.Get(ctx, req.NamespacedName, &ccp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ccp.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &ccp)
	}
	if err := r.ensureFinalizers(ctx, &ccp); err != nil {
		return ctrl.Result{}, err
	}

	before := ccp.Status.DeepCopy()
	var workloadErr error
	requeue := valueOr(r.ResyncPeriod, DefaultResyncPeriod)
	if ccp.Spec.ExternalURL != "" {
		workloadErr = r.adopt(ctx, &ccp)
	} else {
		var after time.Duration
		after, workloadErr = r.reconcileWorkload(ctx, &ccp)
		requeue = minPositive(requeue, after)
	}
	requeue = minPositive(requeue, r.reconcileAccess(ctx, &ccp))

	ccp.Status.Phase = computePhase(before.Phase, ccp.Status.Conditions)
	ccp.Status.ObservedGeneration = ccp.Generation
	if !equality.Semantic.DeepEqual(*before, ccp.Status) {
		patchBase := ccp.DeepCopy()
		patchBase.Status = *before
		if err := r.Client.Status().Patch(ctx, &ccp, client.MergeFrom(patchBase)); err != nil {
			if apierrors.IsNotFound(err) {
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, fmt.Errorf("update status of control plane %s/%s: %w", ccp.Namespace, ccp.Name, err)
		}
		// Announce transitions once they are recorded, so a failed
		// status write does not announce them twice.
		r.recordTransitions(&ccp, before.Conditions, ccp.Status.Conditions)
	}
	if workloadErr != nil {
		// Retried with the controller's per-object exponential backoff.
		return ctrl.Result{}, workloadErr
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// ensureFinalizers adds the finalizers the control plane needs before
// anything they guard is created.
func (r *Reconciler) ensureFinalizers(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	names := []string{FinalizerOperatorAccess}
	if ccp.Spec.ExternalURL == "" && len(workspaceRBACNamespaces(ccp)) > 1 {
		names = append(names, FinalizerWorkspaceRBAC)
	}
	return r.patchFinalizers(ctx, ccp, func(obj client.Object) bool {
		changed := false
		for _, n := range names {
			changed = controllerutil.AddFinalizer(obj, n) || changed
		}
		return changed
	})
}

// removeFinalizers removes finalizers.
func (r *Reconciler) removeFinalizers(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, names ...string) error {
	err := r.patchFinalizers(ctx, ccp, func(obj client.Object) bool {
		changed := false
		for _, n := range names {
			changed = controllerutil.RemoveFinalizer(obj, n) || changed
		}
		return changed
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// patchFinalizers writes the finalizers change makes, failing on a
// concurrent change rather than overwriting someone else's finalizer. It
// updates only ccp's metadata: the status the reconcile is building stays.
func (r *Reconciler) patchFinalizers(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, change func(client.Object) bool) error {
	obj := ccp.DeepCopy()
	if !change(obj) {
		return nil
	}
	if err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(ccp, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("update finalizers of control plane %s/%s: %w", ccp.Namespace, ccp.Name, err)
	}
	ccp.ObjectMeta = obj.ObjectMeta
	return nil
}

// adopt handles a control plane with spec.externalURL: nothing deployed
// (children of an earlier deployed spec are deleted), the URL is the
// external one.
func (r *Reconciler) adopt(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	ccp.Status.URL = ccp.Spec.ExternalURL
	ccp.Status.Replicas, ccp.Status.ReadyReplicas = 0, 0
	apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionReconciled)
	apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionExposed)
	if err := r.prune(ctx, ccp, keepSet{}); err != nil {
		return err
	}
	if controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		return r.releaseWorkspaceRBACFinalizer(ctx, ccp)
	}
	return nil
}

// reconcileWorkload applies the children of a deployed control plane and
// sets the Reconciled, Exposed and Available conditions. It returns when
// to check again and an error to retry with backoff.
func (r *Reconciler) reconcileWorkload(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (time.Duration, error) {
	ccp.Status.URL = inClusterURL(ccp, valueOr(r.ClusterDomain, DefaultClusterDomain))

	missing, err := r.missingSecrets(ctx, ccp)
	if err != nil {
		return 0, err
	}

	keep := keepSet{}
	var errs []error
	apply := func(obj client.Object, owned bool) {
		reader := client.Reader(r.Client)
		if obj.GetObjectKind().GroupVersionKind() == httpRouteGVK {
			reader = r.routeReader
		}
		if _, err := r.applyChild(ctx, reader, ccp, obj, owned); err != nil {
			errs = append(errs, err)
		}
		keep.add(obj)
	}

	if createServiceAccount(ccp) {
		apply(desiredServiceAccount(ccp), true)
	}
	for _, ns := range workspaceRBACNamespaces(ccp) {
		owned := ns == ccp.Namespace
		apply(desiredWorkspaceRole(ccp, ns), owned)
		apply(desiredWorkspaceRoleBinding(ccp, ns), owned)
	}
	apply(desiredDeployment(ccp, valueOr(r.DefaultImage, DefaultImage), valueOr(r.ClusterDomain, DefaultClusterDomain)), true)
	apply(desiredService(ccp), true)

	// Exposure reports in its own condition; its errors are retried like
	// the others but do not make the workload itself look broken.
	workloadErrs := len(errs)
	var requeue time.Duration
	if exp := ccp.Spec.Expose; exp == nil || (exp.Ingress == nil && exp.HTTPRoute == nil) {
		apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionExposed)
	} else if exp.Ingress != nil {
		apply(desiredIngress(ccp), true)
		r.setExposed(ccp, errs[workloadErrs:], coderv1alpha1.ReasonIngressApplied, fmt.Sprintf("Ingress %s routes %s to coderd", ccp.Name, exp.Ingress.Host))
	} else {
		installed, err := r.httpRouteInstalled()
		switch {
		case err != nil:
			setCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionUnknown, coderv1alpha1.ReasonApplyError, err.Error())
			requeue = valueOr(r.GatewayAPIRecheckPeriod, gatewayAPIRecheck)
		case !installed:
			setCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionFalse, coderv1alpha1.ReasonGatewayAPINotInstalled,
				"spec.expose.httpRoute needs the Gateway API: the HTTPRoute kind (gateway.networking.k8s.io/v1) is not installed in the cluster; install the Gateway API CRDs or use spec.expose.ingress")
			requeue = valueOr(r.GatewayAPIRecheckPeriod, gatewayAPIRecheck)
		default:
			apply(desiredHTTPRoute(ccp), true)
			r.setExposed(ccp, errs[workloadErrs:], coderv1alpha1.ReasonHTTPRouteApplied, fmt.Sprintf("HTTPRoute %s attaches coderd to %d Gateway(s)", ccp.Name, len(exp.HTTPRoute.ParentRefs)))
		}
	}
	var cleanupErrs []error
	if err := r.prune(ctx, ccp, keep); err != nil {
		cleanupErrs = append(cleanupErrs, err)
	}
	if len(workspaceRBACNamespaces(ccp)) <= 1 && controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		if err := r.releaseWorkspaceRBACFinalizer(ctx, ccp); err != nil {
			cleanupErrs = append(cleanupErrs, err)
		}
	}

	r.setReconciled(ccp, append(slices.Clip(errs[:workloadErrs]), cleanupErrs...), missing)
	errs = append(errs, cleanupErrs...)
	if err := r.setAvailableFromDeployment(ctx, ccp); err != nil {
		errs = append(errs, err)
	}
	return requeue, errors.Join(errs...)
}

// setExposed sets the Exposed condition from the outcome of applying the
// Ingress or HTTPRoute.
func (r *Reconciler) setExposed(ccp *coderv1alpha1.CoderControlPlane, errs []error, okReason, okMessage string) {
	if len(errs) == 0 {
		setCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionTrue, okReason, okMessage)
		return
	}
	reason := coderv1alpha1.ReasonApplyError
	if permanent(errs...) {
		reason = coderv1alpha1.ReasonApplyFailed
	}
	setCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionFalse, reason, errors.Join(errs...).Error())
}

// setReconciled sets the Reconciled condition: refused children first
// (they need a change), then missing Secrets.
func (r *Reconciler) setReconciled(ccp *coderv1alpha1.CoderControlPlane, errs []error, missing []string) {
	var missingMsg string
	if len(missing) > 0 {
		missingMsg = fmt.Sprintf("Secret(s) %s referenced by spec.tls or spec.caCerts not found in namespace %s; coderd pods cannot start until they exist",
			strings.Join(missing, ", "), ccp.Namespace)
	}
	switch {
	case len(errs) > 0:
		reason := coderv1alpha1.ReasonApplyError
		if permanent(errs...) {
			reason = coderv1alpha1.ReasonApplyFailed
		}
		msg := errors.Join(errs...).Error()
		if missingMsg != "" {
			msg += "; " + missingMsg
		}
		setCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, reason, msg)
	case len(missing) > 0:
		setCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionFalse, coderv1alpha1.ReasonSecretNotFound, missingMsg)
	default:
		setCondition(ccp, coderv1alpha1.ConditionReconciled, metav1.ConditionTrue, coderv1alpha1.ReasonApplied, "all children are up to date")
	}
}

// permanent reports whether any error needs a change to the spec or the
// cluster rather than a retry.
func permanent(errs ...error) bool {
	for _, err := range errs {
		var nm *errNotManaged
		switch {
		case errors.As(err, &nm), apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsBadRequest(err),
			apierrors.IsNotFound(err): // NotFound on apply: the namespace does not exist
			return true
		}
	}
	return false
}

// setAvailableFromDeployment copies the Deployment's availability and
// replica counts into the status.
func (r *Reconciler) setAvailableFromDeployment(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	var dep appsv1.Deployment
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: ccp.Name}, &dep)
	if apierrors.IsNotFound(err) {
		ccp.Status.Replicas, ccp.Status.ReadyReplicas = 0, 0
		setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
			fmt.Sprintf("Deployment %s does not exist yet", ccp.Name))
		return nil
	}
	if err != nil {
		return fmt.Errorf("get Deployment %s/%s: %w", ccp.Namespace, ccp.Name, err)
	}
	ccp.Status.Replicas = dep.Status.Replicas
	ccp.Status.ReadyReplicas = dep.Status.ReadyReplicas
	for _, c := range dep.Status.Conditions {
		if c.Type != appsv1.DeploymentAvailable {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonDeploymentAvailable,
				fmt.Sprintf("Deployment %s is available: %d of %d replicas ready", dep.Name, dep.Status.ReadyReplicas, ptrValue(dep.Spec.Replicas)))
			return nil
		}
		setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
			fmt.Sprintf("Deployment %s is not available (%s): %s", dep.Name, c.Reason, c.Message))
		return nil
	}
	setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonDeploymentUnavailable,
		fmt.Sprintf("Deployment %s has not reported availability yet: %d of %d replicas ready", dep.Name, dep.Status.ReadyReplicas, ptrValue(dep.Spec.Replicas)))
	return nil
}

// missingSecrets returns the Secrets the pods mount that do not exist. It
// reads metadata only, from the cache the Secret watch fills.
func (r *Reconciler) missingSecrets(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) ([]string, error) {
	var missing []string
	for _, name := range referencedSecrets(ccp) {
		var meta metav1.PartialObjectMetadata
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: name}, &meta)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, name)
		case err != nil:
			return nil, fmt.Errorf("look up Secret %s/%s: %w", ccp.Namespace, name, err)
		}
	}
	return missing, nil
}

// reconcileAccess runs the access manager against status.url and records
// its result. It returns when access should be checked again.
func (r *Reconciler) reconcileAccess(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) time.Duration {
	actx, cancel := context.WithTimeout(ctx, valueOr(r.AccessTimeout, DefaultAccessTimeout))
	res, err := r.Access.Reconcile(actx, ccp.DeepCopy(), ccp.Status.URL)
	cancel()
	adopted := ccp.Spec.ExternalURL != ""

	if err != nil {
		// Not a crash: the condition says what failed, and the check
		// is repeated with a backoff that grows while it keeps failing.
		reason := classifyAccessError(err)
		if res.Reason != "" && res.Reason != coderv1alpha1.ReasonTokenValid {
			// The manager classified the failure itself.
			reason = res.Reason
		}
		setCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, metav1.ConditionFalse, reason, "operator access: "+err.Error())
		if res.CoderVersion != "" {
			// It failed after coderd answered.
			ccp.Status.CoderVersion = res.CoderVersion
		}
		if adopted {
			switch {
			case res.CoderVersion != "":
				setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonCoderdReachable,
					fmt.Sprintf("coderd %s answers at %s", res.CoderVersion, ccp.Status.URL))
			case reason == coderv1alpha1.ReasonCoderdUnreachable:
				setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable,
					fmt.Sprintf("coderd at %s is unreachable: %v", ccp.Status.URL, err))
			default:
				setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionUnknown, coderv1alpha1.ReasonReachabilityUnknown,
					"operator access failed before it reached coderd: "+err.Error())
			}
		}
		r.setLicense(ccp, nil)
		logf.FromContext(ctx).Info("operator access failed", "url", ccp.Status.URL, "reason", reason, "error", err.Error())
		return backoff(apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady), time.Now(), minAccessBackoff, maxAccessBackoff)
	}

	reason, msg := res.Reason, res.Message
	if reason == "" {
		reason = map[bool]string{true: coderv1alpha1.ReasonTokenValid, false: coderv1alpha1.ReasonAccessError}[res.Ready]
	}
	if msg == "" {
		msg = map[bool]string{true: "the operator holds a valid Coder token", false: "the operator holds no valid Coder token"}[res.Ready]
	}
	status := boolStatus(res.Ready)
	if res.Unverified {
		status = metav1.ConditionUnknown
	}
	setCondition(ccp, coderv1alpha1.ConditionOperatorAccessReady, status, reason, msg)

	st := &ccp.Status
	st.OperatorTokenSecretRef = res.TokenSecretRef // nil unless ready or unverified, so no one uses a token known to be bad
	switch {
	case res.User != "":
		st.OperatorUser = res.User
	case reason == coderv1alpha1.ReasonDisabled:
		st.OperatorUser = ""
	}
	if res.AdminCredentialsSecret != "" {
		st.AdminCredentialsSecretRef = &corev1.LocalObjectReference{Name: res.AdminCredentialsSecret}
	}
	// Keep the last known version and entitlements while coderd does
	// not answer; they describe the coderd, not the connection.
	if res.CoderVersion != "" {
		st.CoderVersion = res.CoderVersion
		st.Entitlements = res.Entitlements
	}
	if adopted {
		switch {
		case res.CoderVersion != "":
			setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionTrue, coderv1alpha1.ReasonCoderdReachable,
				fmt.Sprintf("coderd %s answers at %s", res.CoderVersion, st.URL))
		case reason == coderv1alpha1.ReasonCoderdUnreachable:
			setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, coderv1alpha1.ReasonCoderdUnreachable, msg)
		default:
			setCondition(ccp, coderv1alpha1.ConditionAvailable, metav1.ConditionUnknown, coderv1alpha1.ReasonReachabilityUnknown,
				"operator access did not report coderd's version ("+reason+")")
		}
	}
	r.setLicense(ccp, res.License)

	if !res.Ready && res.RequeueAfter <= 0 {
		return backoff(apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady), time.Now(), minAccessBackoff, maxAccessBackoff)
	}
	return res.RequeueAfter
}

// setLicense sets LicenseApplied when spec.license is set; lic is nil when
// the access manager could not tell.
func (r *Reconciler) setLicense(ccp *coderv1alpha1.CoderControlPlane, lic *operatoraccess.LicenseResult) {
	if ccp.Spec.License == nil {
		apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionLicenseApplied)
		return
	}
	if lic != nil {
		reason := lic.Reason
		if reason == "" {
			reason = map[bool]string{true: coderv1alpha1.ReasonApplied, false: coderv1alpha1.ReasonLicenseNotApplied}[lic.Applied]
		}
		setCondition(ccp, coderv1alpha1.ConditionLicenseApplied, boolStatus(lic.Applied), reason, lic.Message)
		return
	}
	if apimeta.FindStatusCondition(ccp.Status.Conditions, coderv1alpha1.ConditionLicenseApplied) == nil {
		setCondition(ccp, coderv1alpha1.ConditionLicenseApplied, metav1.ConditionUnknown, coderv1alpha1.ReasonWaitingForAccess,
			"the license is uploaded once the operator has access to coderd")
	}
}

// classifyAccessError names the OperatorAccessReady reason for an error
// the access manager returned instead of a Result.
func classifyAccessError(err error) string {
	var netErr net.Error
	var urlErr *url.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr), errors.As(err, &urlErr):
		return coderv1alpha1.ReasonCoderdUnreachable
	case coderapi.StatusCode(err) != 0:
		return coderv1alpha1.ReasonCoderAPIError
	default:
		return coderv1alpha1.ReasonAccessError
	}
}

// finalize runs on a control plane being deleted: revoke the operator's
// token, delete the workspace RBAC in other namespaces, then let go.
func (r *Reconciler) finalize(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (ctrl.Result, error) {
	var release []string
	var requeue time.Duration
	if controllerutil.ContainsFinalizer(ccp, FinalizerOperatorAccess) {
		done, after := r.revoke(ctx, ccp)
		if done {
			release = append(release, FinalizerOperatorAccess)
		}
		requeue = after
	}
	if controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		if err := r.deleteWorkspaceRBAC(ctx, ccp, nil); err != nil {
			return ctrl.Result{}, err
		}
		release = append(release, FinalizerWorkspaceRBAC)
	}
	if err := r.removeFinalizers(ctx, ccp, release...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// revoke revokes the operator's token. It reports done when revoked, or
// when RevokeGracePeriod has passed since deletion was requested: then
// the finalizer goes anyway, with a Warning event naming what may be left
// in coderd, so that an unreachable coderd never blocks deletion forever.
// Until then it asks to be retried after a growing interval.
func (r *Reconciler) revoke(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (done bool, retryAfter time.Duration) {
	log := logf.FromContext(ctx)
	coderURL := ccp.Status.URL
	if coderURL == "" {
		coderURL = ccp.Spec.ExternalURL
		if coderURL == "" {
			coderURL = inClusterURL(ccp, valueOr(r.ClusterDomain, DefaultClusterDomain))
		}
	}
	rctx, cancel := context.WithTimeout(ctx, valueOr(r.RevokeTimeout, DefaultRevokeTimeout))
	err := r.Access.Revoke(rctx, ccp, coderURL)
	cancel()
	if err == nil {
		log.Info("revoked operator access", "url", coderURL)
		return true, 0
	}
	grace := valueOr(r.RevokeGracePeriod, DefaultRevokeGracePeriod)
	deadline := ccp.DeletionTimestamp.Add(grace)
	now := time.Now()
	if now.Before(deadline) {
		log.Info("revoking operator access failed; retrying", "url", coderURL, "error", err.Error(), "giveUpAt", deadline)
		r.event(ccp, corev1.EventTypeWarning, "RevokeFailed",
			fmt.Sprintf("revoking the operator's Coder token failed: %v; retrying until %s, then deletion proceeds without it", err, deadline.UTC().Format(time.RFC3339)))
		since := &metav1.Condition{LastTransitionTime: *ccp.DeletionTimestamp}
		return false, min(backoff(since, now, 2*time.Second, 30*time.Second), deadline.Sub(now)+time.Second)
	}
	user := ccp.Status.OperatorUser
	if user == "" {
		user = "(unknown)"
	}
	log.Error(err, "giving up revoking operator access; removing the finalizer", "url", coderURL, "gracePeriod", grace, "operatorUser", user)
	r.event(ccp, corev1.EventTypeWarning, "RevokeAbandoned",
		fmt.Sprintf("could not revoke the operator's Coder token within %s (%v); deleting anyway: revoke the tokens of Coder user %s at %s by hand", grace, err, user, coderURL))
	return true, 0
}

// releaseWorkspaceRBACFinalizer deletes the workspace RBAC of other
// namespaces that is no longer wanted, reading from the API server so a
// stale cache cannot leak an object, and then drops the finalizer.
func (r *Reconciler) releaseWorkspaceRBACFinalizer(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	keep := keepSet{}
	if ccp.Spec.ExternalURL == "" {
		for _, ns := range workspaceRBACNamespaces(ccp) {
			keep.add(desiredWorkspaceRole(ccp, ns))
			keep.add(desiredWorkspaceRoleBinding(ccp, ns))
		}
	}
	if err := r.deleteWorkspaceRBAC(ctx, ccp, keep); err != nil {
		return err
	}
	return r.removeFinalizers(ctx, ccp, FinalizerWorkspaceRBAC)
}

func valueOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// minPositive is the smaller of two durations, ignoring zero ("no
// preference").
func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	default:
		return min(a, b)
	}
}

func ptrValue(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

// recheck drops the access manager's last result for the control plane
// named by e and reconciles it, so its token is checked with coderd now.
func (r *Reconciler) recheck(ctx context.Context, e event.TypedGenericEvent[types.NamespacedName], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
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
	q.Add(reconcile.Request{NamespacedName: key})
}
