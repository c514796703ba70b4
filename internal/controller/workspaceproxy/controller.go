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
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

const (
	// Finalizer holds a CoderWorkspaceProxy until its registration is
	// deleted in Coder.
	Finalizer = "coder.com/workspace-proxy"
	// ControlPlaneRefIndex indexes CoderWorkspaceProxies by
	// spec.controlPlaneRef.name.
	ControlPlaneRefIndex = dependent.ControlPlaneRefIndex
	// DefaultImage runs the proxy when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultIcon is the icon `coder wsproxy create` suggests; coderd
	// requires an icon (and a display name) to edit a proxy.
	DefaultIcon = "/emojis/1f5fa.png"
	// DefaultCleanupTimeout bounds how long deletion waits for the proxy's
	// deregistration in Coder.
	DefaultCleanupTimeout = dependent.DefaultCleanupTimeout

	// UnsupportedRequeue is how often a coderd without the feature is asked
	// again (a license may be added).
	UnsupportedRequeue = 10 * time.Minute
	// SteadyRequeue re-checks the registration when everything is ready
	// (and notices a rotated supplied token).
	SteadyRequeue = 10 * time.Minute

	controllerName = "coderworkspaceproxy"
)

// Event reasons that are not condition reasons.
const (
	EventProxyRegistered           = "ProxyRegistered"
	EventProxyUpdated              = "ProxyUpdated"
	EventTokenRegenerated          = "TokenRegenerated"
	EventProxyDeregistered         = "ProxyDeregistered"
	EventProxyDeregistrationFailed = "ProxyDeregistrationFailed"
)

// Reconciler reconciles CoderWorkspaceProxy objects. Base.DefaultImage
// runs the proxy when spec.image is empty; Base.CleanupTimeout bounds how
// long deletion waits for the proxy's deregistration before the finalizer
// is removed anyway with a Warning event naming the proxy to delete by
// hand.
type Reconciler struct {
	dependent.Base
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
// CoderControlPlanes they reference, also when coderd's access URL, which
// the proxy runs with, changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b, err := r.NewController(mgr, dependent.Controller{
		Name:    controllerName,
		Kind:    "CoderWorkspaceProxy",
		Object:  &coderv1alpha1.CoderWorkspaceProxy{},
		NewList: func() client.ObjectList { return &coderv1alpha1.CoderWorkspaceProxyList{} },
		ControlPlaneRef: func(o client.Object) string {
			if p, ok := o.(*coderv1alpha1.CoderWorkspaceProxy); ok {
				return p.Spec.ControlPlaneRef.Name
			}
			return ""
		},
		ControlPlaneChanged: func(o, n *coderv1alpha1.CoderControlPlane) bool {
			return o.Spec.AccessURL != n.Spec.AccessURL
		},
	})
	if err != nil {
		return err
	}
	return b.Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Complete(r)
}

// Reconcile brings one CoderWorkspaceProxy to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderWorkspaceProxy
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.DeletionTimestamp.IsZero() {
		return r.Finalize(ctx, &obj, r.proxyCleanup(&obj))
	}
	st := dependent.NewState(&obj, &obj.Status)
	res, err := r.reconcile(ctx, &obj, st)
	return r.Kit().Finish(ctx, st.Status, res, err)
}

// reconcile is one pass over obj, whose status st builds.
func (r *Reconciler) reconcile(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, st *dependent.State) (ctrl.Result, error) {
	ccp, cl, res, err := r.ControlPlane(ctx, st, obj.Spec.ControlPlaneRef.Name)
	if cl == nil {
		return res, err
	}
	// A client per pass: its connections are not reused by the next.
	defer coderapi.CloseIdle(cl)

	proxies, err := cl.WorkspaceProxies(ctx)
	if st.Unsupported(err, "workspace proxies") {
		st.SetControlPlaneReady(ccp)
		return ctrl.Result{RequeueAfter: UnsupportedRequeue}, nil
	}
	if err != nil {
		return ctrl.Result{}, st.CoderError("list workspace proxies", err)
	}
	st.SetControlPlaneReady(ccp)
	st.Supported("workspace proxies")

	var cred credentials
	if obj.Spec.ProxyTokenSecretRef != nil {
		if err := r.dropRegistration(ctx, obj, st, cl); err != nil {
			return ctrl.Result{}, st.CoderError("deregister the proxy registered before a token was supplied", err)
		}
		var ok bool
		cred, ok, err = r.suppliedCredentials(ctx, obj)
		if err != nil {
			return ctrl.Result{}, err
		}
		if !ok {
			ref := obj.Spec.ProxyTokenSecretRef
			st.Waiting(coderv1alpha1.ConditionCredentialsReady, coderv1alpha1.ReasonTokenSecretNotFound,
				fmt.Sprintf("spec.proxyTokenSecretRef: Secret %s has no key %q", ref.Name, ref.Key))
			return ctrl.Result{RequeueAfter: dependent.AccessNotReadyRequeue}, nil
		}
		st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, coderv1alpha1.ReasonTokenSupplied,
			fmt.Sprintf("the proxy runs with the token in Secret %s (key %q)", cred.ref.Name, cred.ref.Key), "")
	} else {
		// The finalizer goes on before the proxy exists in Coder, so a
		// registration cannot outlive the object unnoticed.
		if err := r.EnsureFinalizer(ctx, obj, Finalizer); err != nil {
			return ctrl.Result{}, err
		}
		cred, err = r.ensureRegistration(ctx, obj, st, cl, proxies.Regions)
		if err != nil {
			if st.Conflict(coderv1alpha1.ConditionCredentialsReady, err) {
				return ctrl.Result{RequeueAfter: dependent.FailedRequeue}, nil
			}
			return ctrl.Result{}, st.CoderError("register workspace proxy", err)
		}
		st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, coderv1alpha1.ReasonRegistered,
			fmt.Sprintf("workspace proxy %q is registered; its token is stored in Secret %s", proxyName(obj), cred.ref.Name), "")
	}
	obj.Status.ProxyID = cred.proxyID
	obj.Status.TokenSecretRef = &cred.ref
	obj.Status.URL = obj.Spec.AccessURL

	dep, err := r.applyWorkload(ctx, obj, ccp, cred)
	if err != nil {
		if st.Conflict(coderv1alpha1.ConditionAvailable, err) {
			return ctrl.Result{RequeueAfter: dependent.FailedRequeue}, nil
		}
		return ctrl.Result{}, err
	}
	st.SetAvailability(dep)
	return ctrl.Result{RequeueAfter: SteadyRequeue}, nil
}
