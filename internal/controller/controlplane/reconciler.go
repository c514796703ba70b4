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
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// AccessManager is the Coder-API half of a control plane: the operator's
// user and token in coderd. *operatoraccess.Manager implements it.
type AccessManager interface {
	// ReconcileAt establishes or checks the operator's access to the
	// coderd at ep and reports it.
	ReconcileAt(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, ep operatoraccess.Endpoint) (operatoraccess.Result, error)
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
	// missingSecretRecheck is how often a control plane whose pods
	// mount a Secret that does not exist looks for it again: users'
	// Secrets are read uncached and not watched.
	missingSecretRecheck = 10 * time.Second
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
	// WorkspaceRBAC is what spec.workspaceRBAC may ask for; nil means
	// DefaultWorkspaceRBACPolicy.
	WorkspaceRBAC *WorkspaceRBACPolicy

	gateway gatewayAPI
	// routeReader reads HTTPRoutes. They are unstructured, which the
	// manager's client does not cache; the cache does.
	routeReader client.Reader
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

	st := reconcile.Begin(&ccp, &ccp.Status)
	var workloadErr error
	requeue := valueOr(r.ResyncPeriod, DefaultResyncPeriod)
	if ccp.Spec.ExternalURL != "" {
		workloadErr = r.adopt(ctx, &ccp)
		after, _ := r.reconcileAccess(ctx, &ccp, operatoraccess.Endpoint{URL: ccp.Status.URL})
		requeue = minPositive(requeue, after)
	} else {
		initialized, err := r.initialized(ctx, &ccp)
		if err != nil {
			return ctrl.Result{}, err
		}
		var after time.Duration
		after, workloadErr = r.reconcileWorkload(ctx, &ccp, initialized)
		requeue = minPositive(requeue, after)
		if initialized {
			after, _ = r.reconcileAccess(ctx, &ccp, operatoraccess.Endpoint{URL: ccp.Status.URL})
			requeue = minPositive(requeue, after)
		} else if after, initialized = r.reconcileSetup(ctx, &ccp); initialized {
			// The first user exists: coderd may be reached by others now.
			requeue = minPositive(requeue, after)
			after, workloadErr = r.reconcileWorkload(ctx, &ccp, true)
			requeue = minPositive(requeue, after)
		} else {
			requeue = minPositive(requeue, after)
		}
	}

	ccp.Status.Phase = computePhase(st.StartPhase(), ccp.Status.Conditions)
	for _, e := range transitions(st.StartConditions(), ccp.Status.Conditions) {
		st.Event(e.Type, e.Reason, e.Action, e.Note)
	}
	// A workload error is retried with the controller's per-object
	// exponential backoff.
	return r.kit().Finish(ctx, st, ctrl.Result{RequeueAfter: requeue}, workloadErr)
}

// kit is what the reconciler writes status, events and finalizers with.
// Its RBAC patches the status: a pass that started from a stale copy
// (the cache had not seen the last status write yet, while a child's
// event it caused had arrived) conflicts and is retried from the current
// object, without announcing its transitions a second time.
func (r *Reconciler) kit() reconcile.Kit {
	return reconcile.Kit{Client: r.Client, Recorder: r.Recorder, PatchStatus: true}
}

// adopt handles a control plane with spec.externalURL: nothing deployed
// (children of an earlier deployed spec are deleted), the URL is the
// external one.
func (r *Reconciler) adopt(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	ccp.Status.URL = ccp.Spec.ExternalURL
	ccp.Status.Replicas, ccp.Status.ReadyReplicas = 0, 0
	apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionReconciled)
	apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionExposed)
	apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionInitialized)
	if err := r.prune(ctx, ccp, keepSet{}); err != nil {
		return err
	}
	if controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		return r.releaseWorkspaceRBACFinalizer(ctx, ccp, workspaceRBAC{})
	}
	return nil
}

// reconcileWorkload applies the children of a deployed control plane and
// sets the Reconciled, Exposed and Available conditions. The Service,
// Ingress and HTTPRoute are applied only once coderd is initialized (has
// its first user). It returns when to check again and an error to retry
// with backoff.
func (r *Reconciler) reconcileWorkload(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, initialized bool) (time.Duration, error) {
	ccp.Status.URL = inClusterURL(ccp, valueOr(r.ClusterDomain, DefaultClusterDomain))

	missing, err := r.missingSecrets(ctx, ccp)
	if err != nil {
		return 0, err
	}
	var requeue time.Duration
	if len(missing) > 0 {
		// Users' Secrets are not watched: look again soon.
		requeue = missingSecretRecheck
	}

	keep := keepSet{}
	var errs []error
	apply := func(obj client.Object) {
		reader := client.Reader(r.Client)
		if obj.GetObjectKind().GroupVersionKind() == httpRouteGVK {
			reader = r.routeReader
		}
		if _, err := (workload.Applier{Client: r.Client, Scheme: r.Scheme, Uncached: r.APIReader}).Apply(ctx, reader, owner(ccp), obj, nil); err != nil {
			errs = append(errs, err)
		}
		keep.add(obj)
	}

	if createServiceAccount(ccp) {
		apply(desiredServiceAccount(ccp))
	}
	// A refused spec gets no workspace RBAC; what an earlier spec got is
	// pruned below.
	rbacPlan, refused := r.workspaceRBACPlan(ccp)
	for _, rb := range rbacPlan.bindings(ccp) {
		apply(rb)
	}
	apply(desiredDeployment(ccp, valueOr(r.DefaultImage, DefaultImage), valueOr(r.ClusterDomain, DefaultClusterDomain)))
	if initialized {
		apply(desiredService(ccp))
	}

	// Exposure reports in its own condition; its errors are retried like
	// the others but do not make the workload itself look broken.
	workloadErrs := len(errs)
	if exp := ccp.Spec.Expose; exp == nil || (exp.Ingress == nil && exp.HTTPRoute == nil) {
		apimeta.RemoveStatusCondition(&ccp.Status.Conditions, coderv1alpha1.ConditionExposed)
	} else if !initialized {
		reconcile.SetCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionFalse, coderv1alpha1.ReasonAwaitingFirstUser,
			"the Ingress or HTTPRoute is created once coderd has its first user (see condition Initialized)")
	} else if exp.Ingress != nil {
		apply(desiredIngress(ccp))
		r.setExposed(ccp, errs[workloadErrs:], coderv1alpha1.ReasonIngressApplied, fmt.Sprintf("Ingress %s routes %s to coderd", ccp.Name, exp.Ingress.Host))
	} else {
		installed, err := r.httpRouteInstalled()
		switch {
		case err != nil:
			reconcile.SetCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionUnknown, coderv1alpha1.ReasonApplyError, err.Error())
			requeue = minPositive(requeue, valueOr(r.GatewayAPIRecheckPeriod, gatewayAPIRecheck))
		case !installed:
			reconcile.SetCondition(ccp, coderv1alpha1.ConditionExposed, metav1.ConditionFalse, coderv1alpha1.ReasonGatewayAPINotInstalled,
				"spec.expose.httpRoute needs the Gateway API: the HTTPRoute kind (gateway.networking.k8s.io/v1) is not installed in the cluster; install the Gateway API CRDs or use spec.expose.ingress")
			requeue = minPositive(requeue, valueOr(r.GatewayAPIRecheckPeriod, gatewayAPIRecheck))
		default:
			apply(desiredHTTPRoute(ccp))
			r.setExposed(ccp, errs[workloadErrs:], coderv1alpha1.ReasonHTTPRouteApplied, fmt.Sprintf("HTTPRoute %s attaches coderd to %d Gateway(s)", ccp.Name, len(exp.HTTPRoute.ParentRefs)))
		}
	}
	var cleanupErrs []error
	if err := r.prune(ctx, ccp, keep); err != nil {
		cleanupErrs = append(cleanupErrs, err)
	}
	if !rbacPlan.reachesOtherNamespaces() && controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		if err := r.releaseWorkspaceRBACFinalizer(ctx, ccp, rbacPlan); err != nil {
			cleanupErrs = append(cleanupErrs, err)
		}
	}

	r.setReconciled(ccp, refused, append(slices.Clip(errs[:workloadErrs]), cleanupErrs...), missing)
	errs = append(errs, cleanupErrs...)
	if err := r.setAvailableFromDeployment(ctx, ccp); err != nil {
		errs = append(errs, err)
	}
	return requeue, errors.Join(errs...)
}

// missingSecrets returns the Secrets the pods mount that do not exist. It
// reads their metadata from the API server: they are the user's, and the
// cache holds only the operator's own Secrets (package kubecache).
func (r *Reconciler) missingSecrets(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) ([]string, error) {
	var missing []string
	for _, name := range referencedSecrets(ccp) {
		var meta metav1.PartialObjectMetadata
		meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		err := r.apiReader().Get(ctx, types.NamespacedName{Namespace: ccp.Namespace, Name: name}, &meta)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, name)
		case err != nil:
			return nil, fmt.Errorf("look up Secret %s/%s: %w", ccp.Namespace, name, err)
		}
	}
	return missing, nil
}

// apiReader reads from the API server (the Client when no APIReader is
// set).
func (r *Reconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
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
