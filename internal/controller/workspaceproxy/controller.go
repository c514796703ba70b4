// Package workspaceproxy reconciles CoderWorkspaceProxy: a workspace proxy
// (`coder wsproxy server`) for a CoderControlPlane, with its Deployment and
// Service.
//
// What it does for each CoderWorkspaceProxy:
//   - resolves the CoderControlPlane (same namespace) and acts on its coderd
//     as the operator (coderapi.ForControlPlane);
//   - without spec.proxyTokenSecretRef, registers the proxy through the
//     Coder API under the object's name (a CoderControlPlane serves one
//     namespace, so names do not collide; a proxy of that name that this
//     object did not register is reported as NameConflict, never taken
//     over), stores the returned token in a Secret the object owns (key
//     "token"), and keeps the display name and icon in sync; a lost token
//     is regenerated (PATCH regenerate_token) for the proxy it registered;
//   - with spec.proxyTokenSecretRef, runs with that token and registers
//     nothing (a proxy it registered before is deregistered);
//   - runs the proxy in a Deployment (restricted security context by
//     default) behind a Service shaped by spec.service;
//   - on deletion deregisters the proxy it registered (finalizer
//     coder.com/workspace-proxy), best effort and bounded in time (see
//     CleanupTimeout);
//   - on an open-source coderd, or one whose license lacks workspace
//     proxies, reports FeatureSupported=False with Coder's message and phase
//     Unsupported, creates nothing and checks again every UnsupportedRequeue.
package workspaceproxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coder/coder/v2/codersdk"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

const (
	// Finalizer holds a CoderWorkspaceProxy until its registration is
	// deleted in Coder.
	Finalizer = "coder.com/workspace-proxy"
	// ControlPlaneRefIndex indexes CoderWorkspaceProxies by
	// spec.controlPlaneRef.name.
	ControlPlaneRefIndex = "spec.controlPlaneRef.name"
	// DefaultImage runs the proxy when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultIcon is the icon `coder wsproxy create` suggests; coderd
	// requires an icon (and a display name) to edit a proxy.
	DefaultIcon = "/emojis/1f5fa.png"
	// DefaultCleanupTimeout bounds how long deletion waits for the proxy's
	// deregistration in Coder.
	DefaultCleanupTimeout = 5 * time.Minute

	// UnsupportedRequeue is how often a coderd without the feature is asked
	// again (a license may be added).
	UnsupportedRequeue = 10 * time.Minute
	// SteadyRequeue re-checks the registration when everything is ready
	// (and notices a rotated supplied token).
	SteadyRequeue              = 10 * time.Minute
	controlPlaneMissingRequeue = 2 * time.Minute
	accessNotReadyRequeue      = time.Minute
	failedRequeue              = 5 * time.Minute
	cleanupRetry               = 10 * time.Second

	fieldOwner     = "coder-k8s"
	controllerName = "coderworkspaceproxy"
)

// Condition reasons.
const (
	ReasonReady                  = "Ready"
	ReasonControlPlaneNotFound   = "ControlPlaneNotFound"
	ReasonOperatorAccessNotReady = "OperatorAccessNotReady"
	ReasonCoderdUnreachable      = "CoderdUnreachable"
	ReasonCoderAPIError          = "CoderAPIError"
	ReasonSupported              = "Supported"
	ReasonNotSupported           = coderapi.ReasonNotSupported
	ReasonNotEntitled            = coderapi.ReasonNotEntitled
	ReasonRegistered             = "Registered"
	ReasonTokenSupplied          = "TokenSupplied"
	ReasonTokenSecretNotFound    = "TokenSecretNotFound"
	ReasonNameConflict           = "NameConflict"
	ReasonSecretConflict         = "SecretConflict"
	ReasonDeploymentConflict     = "DeploymentConflict"
	ReasonServiceConflict        = "ServiceConflict"
	ReasonReplicasReady          = "ReplicasReady"
	ReasonReplicasNotReady       = "ReplicasNotReady"
	ReasonScaledToZero           = "ScaledToZero"
	ReasonReconciling            = "Reconciling"
)

// Event reasons that are not condition reasons.
const (
	EventProxyRegistered           = "ProxyRegistered"
	EventProxyUpdated              = "ProxyUpdated"
	EventTokenRegenerated          = "TokenRegenerated"
	EventProxyDeregistered         = "ProxyDeregistered"
	EventProxyDeregistrationFailed = "ProxyDeregistrationFailed"
)

// Reconciler reconciles CoderWorkspaceProxy objects.
type Reconciler struct {
	Client client.Client
	// APIReader reads Secrets without caching them cluster-wide.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	// Recorder is the manager's events recorder (mgr.GetEventRecorder).
	Recorder events.EventRecorder
	// CoderTimeout bounds each call to coderd.
	CoderTimeout time.Duration
	// DefaultImage runs the proxy when spec.image is empty.
	DefaultImage string
	// CleanupTimeout bounds, from the deletion request, how long deletion
	// waits for the proxy's deregistration while coderd is unreachable or
	// the operator's access is not ready; then the finalizer is removed
	// anyway with a Warning event naming the proxy to delete by hand. Zero
	// means DefaultCleanupTimeout.
	CleanupTimeout time.Duration
}

// +kubebuilder:rbac:groups=coder.com,resources=coderworkspaceproxies,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coder.com,resources=coderworkspaceproxies/status,verbs=update
// +kubebuilder:rbac:groups=coder.com,resources=coderworkspaceproxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler: it watches
// CoderWorkspaceProxies, the Deployments, Services and Secrets they own
// (Secrets as metadata only, so their data is never cached), and the
// CoderControlPlanes they reference.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.DefaultImage == "" {
		r.DefaultImage = DefaultImage
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &coderv1alpha1.CoderWorkspaceProxy{}, ControlPlaneRefIndex,
		func(o client.Object) []string {
			p, ok := o.(*coderv1alpha1.CoderWorkspaceProxy)
			if !ok || p.Spec.ControlPlaneRef.Name == "" {
				return nil
			}
			return []string{p.Spec.ControlPlaneRef.Name}
		}); err != nil {
		return fmt.Errorf("index CoderWorkspaceProxy by %s: %w", ControlPlaneRefIndex, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// Status writes and finalizer patches do not change the generation:
		// they must not trigger another reconcile.
		For(&coderv1alpha1.CoderWorkspaceProxy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Watches(&coderv1alpha1.CoderControlPlane{},
			handler.EnqueueRequestsFromMapFunc(r.requestsForControlPlane),
			builder.WithPredicates(controlPlaneAccessChanged())).
		Complete(r)
}

// requestsForControlPlane maps a CoderControlPlane to the
// CoderWorkspaceProxies referencing it.
func (r *Reconciler) requestsForControlPlane(ctx context.Context, o client.Object) []reconcile.Request {
	var list coderv1alpha1.CoderWorkspaceProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()),
		client.MatchingFields{ControlPlaneRefIndex: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list CoderWorkspaceProxies for control plane", "controlPlane", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return reqs
}

// controlPlaneAccessChanged passes creations, deletions and the updates of
// a CoderControlPlane that change how the operator reaches its coderd or
// coderd's access URL.
func controlPlaneAccessChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*coderv1alpha1.CoderControlPlane)
			n, ok2 := e.ObjectNew.(*coderv1alpha1.CoderControlPlane)
			if !ok1 || !ok2 {
				return true
			}
			return o.Status.URL != n.Status.URL || o.Spec.AccessURL != n.Spec.AccessURL ||
				!equality.Semantic.DeepEqual(o.Status.OperatorTokenSecretRef, n.Status.OperatorTokenSecretRef) ||
				apimeta.IsStatusConditionTrue(o.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) !=
					apimeta.IsStatusConditionTrue(n.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) ||
				o.Spec.OperatorAccess.Disabled != n.Spec.OperatorAccess.Disabled ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
	}
}

// Reconcile brings one CoderWorkspaceProxy to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderWorkspaceProxy
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &obj)
	}

	st := newState(&obj)
	res, recErr := r.reconcile(ctx, st)
	if err := r.writeStatus(ctx, &obj, st.status); err != nil {
		if apierrors.IsConflict(err) && recErr == nil {
			// A newer version reaches the cache soon; decide again then.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, errors.Join(recErr, fmt.Errorf("write status: %w", err))
	}
	st.emit(r.Recorder)
	if recErr != nil {
		return ctrl.Result{}, recErr
	}
	return res, nil
}

func (r *Reconciler) reconcile(ctx context.Context, st *state) (ctrl.Result, error) {
	obj := st.obj
	ccp, cl, res, err := r.controlPlane(ctx, st)
	if cl == nil {
		return res, err
	}

	proxies, err := cl.WorkspaceProxies(ctx)
	if reason, unavailable := coderapi.FeatureUnavailable(err); unavailable {
		st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionTrue, ReasonReady, "the operator reaches coderd at "+ccp.Status.URL, "")
		st.setCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionFalse, reason,
			"coderd does not offer workspace proxies: "+coderapi.Message(err), corev1.EventTypeWarning)
		st.status.Phase = coderv1alpha1.PhaseUnsupported
		return ctrl.Result{RequeueAfter: UnsupportedRequeue}, nil
	}
	if err != nil {
		return ctrl.Result{}, st.coderError("list workspace proxies", err)
	}
	st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionTrue, ReasonReady, "the operator reaches coderd at "+ccp.Status.URL, "")
	st.setCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionTrue, ReasonSupported, "coderd offers workspace proxies", "")

	var cred credentials
	if obj.Spec.ProxyTokenSecretRef != nil {
		if err := r.dropRegistration(ctx, st, cl); err != nil {
			return ctrl.Result{}, st.coderError("deregister the proxy registered before a token was supplied", err)
		}
		var ok bool
		cred, ok, err = r.suppliedCredentials(ctx, obj)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !ok {
			ref := obj.Spec.ProxyTokenSecretRef
			st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, ReasonTokenSecretNotFound,
				fmt.Sprintf("spec.proxyTokenSecretRef: Secret %s has no key %q", ref.Name, ref.Key), corev1.EventTypeWarning)
			st.status.Phase = st.waitingPhase()
			return ctrl.Result{RequeueAfter: accessNotReadyRequeue}, nil
		}
		st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, ReasonTokenSupplied,
			fmt.Sprintf("the proxy runs with the token in Secret %s (key %q)", cred.ref.Name, cred.ref.Key), "")
	} else {
		// The finalizer goes on before the proxy exists in Coder, so a
		// registration cannot outlive the object unnoticed.
		if err := r.ensureFinalizer(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		cred, err = r.ensureRegistration(ctx, st, cl, proxies.Regions)
		if err != nil {
			var conflict *conflictError
			if errors.As(err, &conflict) {
				st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, conflict.reason, conflict.Error(), corev1.EventTypeWarning)
				st.status.Phase = coderv1alpha1.PhaseFailed
				return ctrl.Result{RequeueAfter: failedRequeue}, nil
			}
			return ctrl.Result{}, st.coderError("register workspace proxy", err)
		}
		st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, ReasonRegistered,
			fmt.Sprintf("workspace proxy %q is registered; its token is stored in Secret %s", proxyName(obj), cred.ref.Name), "")
	}
	st.status.ProxyID = cred.proxyID
	st.status.TokenSecretRef = &cred.ref
	st.status.URL = obj.Spec.AccessURL

	dep, err := r.applyWorkload(ctx, obj, ccp, cred)
	if err != nil {
		var conflict *conflictError
		if errors.As(err, &conflict) {
			st.setCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, conflict.reason, conflict.Error(), corev1.EventTypeWarning)
			st.status.Phase = coderv1alpha1.PhaseFailed
			return ctrl.Result{RequeueAfter: failedRequeue}, nil
		}
		return ctrl.Result{}, err
	}
	st.setAvailability(dep)
	return ctrl.Result{RequeueAfter: SteadyRequeue}, nil
}

// controlPlane resolves the referenced CoderControlPlane and a Coder client
// acting as the operator on it. When it returns a nil client it has set
// the ControlPlaneReady condition and the phase.
func (r *Reconciler) controlPlane(ctx context.Context, st *state) (*coderv1alpha1.CoderControlPlane, *codersdk.Client, ctrl.Result, error) {
	obj := st.obj
	var ccp coderv1alpha1.CoderControlPlane
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Spec.ControlPlaneRef.Name}
	if err := r.Client.Get(ctx, key, &ccp); err != nil {
		if apierrors.IsNotFound(err) {
			st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, ReasonControlPlaneNotFound,
				fmt.Sprintf("CoderControlPlane %q not found in namespace %s", key.Name, key.Namespace), corev1.EventTypeWarning)
			st.status.Phase = st.waitingPhase()
			return nil, nil, ctrl.Result{RequeueAfter: controlPlaneMissingRequeue}, nil
		}
		return nil, nil, ctrl.Result{}, fmt.Errorf("get CoderControlPlane %s: %w", key.Name, err)
	}
	sdk, err := coderapi.ForControlPlane(ctx, r.APIReader, &ccp, r.CoderTimeout)
	if err != nil {
		st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionFalse, ReasonOperatorAccessNotReady,
			err.Error(), corev1.EventTypeWarning)
		st.status.Phase = st.waitingPhase()
		if errors.Is(err, coderapi.ErrAccessNotReady) {
			return nil, nil, ctrl.Result{RequeueAfter: accessNotReadyRequeue}, nil
		}
		return nil, nil, ctrl.Result{}, err
	}
	return &ccp, sdk, ctrl.Result{}, nil
}

// ensureFinalizer adds the finalizer (one patch, only when missing).
func (r *Reconciler) ensureFinalizer(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy) error {
	if controllerutil.ContainsFinalizer(obj, Finalizer) {
		return nil
	}
	base := obj.DeepCopy()
	controllerutil.AddFinalizer(obj, Finalizer)
	if err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("add finalizer: %w", err)
	}
	return nil
}

// writeStatus writes status only when it changed.
func (r *Reconciler) writeStatus(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, status coderv1alpha1.CoderWorkspaceProxyStatus) error {
	if equality.Semantic.DeepEqual(obj.Status, status) {
		return nil
	}
	obj.Status = status
	return r.Client.Status().Update(ctx, obj)
}

func (r *Reconciler) cleanupTimeout() time.Duration {
	if r.CleanupTimeout > 0 {
		return r.CleanupTimeout
	}
	return DefaultCleanupTimeout
}

func (r *Reconciler) image(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	if obj.Spec.Image != "" {
		return obj.Spec.Image
	}
	if r.DefaultImage != "" {
		return r.DefaultImage
	}
	return DefaultImage
}
