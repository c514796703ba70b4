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
//     dependent.Base.CleanupTimeout);
//   - on an open-source coderd, or one whose license lacks workspace
//     proxies, reports FeatureSupported=False with Coder's message and phase
//     Unsupported, creates nothing and checks again every
//     dependent.UnsupportedRequeue.
package workspaceproxy

import (
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

const (
	// Finalizer holds a CoderWorkspaceProxy until its registration is
	// deleted in Coder.
	Finalizer = "coder.com/workspace-proxy"
	// DefaultImage runs the proxy when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultIcon is the icon `coder wsproxy create` suggests; coderd
	// requires an icon (and a display name) to edit a proxy.
	DefaultIcon = "/emojis/1f5fa.png"
)

// Event reasons that are not condition reasons.
const (
	EventProxyRegistered           = "ProxyRegistered"
	EventProxyUpdated              = "ProxyUpdated"
	EventTokenRegenerated          = "TokenRegenerated"
	EventProxyDeregistered         = "ProxyDeregistered"
	EventProxyDeregistrationFailed = "ProxyDeregistrationFailed"
)

// feature is what FeatureSupported reports on.
var feature = dependent.Feature{Name: "workspace proxies"}

// Reconciler reconciles CoderWorkspaceProxy objects (a dependent.Kind).
// Base.DefaultImage runs the proxy when spec.image is empty;
// Base.CleanupTimeout bounds how long deletion waits for the proxy's
// deregistration before the finalizer is removed anyway with a Warning
// event naming the proxy to delete by hand.
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

// SetupWithManager registers the reconciler (dependent.Setup): it watches
// CoderWorkspaceProxies, the Deployments, Services and Secrets they own,
// and the CoderControlPlanes they reference, also when coderd's access
// URL, which the proxy runs with, changes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return dependent.Setup(mgr, &r.Base, r, dependent.Controller{
		Object: &coderv1alpha1.CoderWorkspaceProxy{},
		Owns:   []client.Object{&corev1.Service{}},
		ControlPlaneChanged: func(o, n *coderv1alpha1.CoderControlPlane) bool {
			return o.Spec.AccessURL != n.Spec.AccessURL
		},
	})
}

// Reconcile brings one CoderWorkspaceProxy to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderWorkspaceProxy
	return dependent.Reconcile(ctx, &r.Base, r, req, &obj, &obj.Status)
}

// Pass registers the proxy (or takes the supplied token) and runs it.
func (r *Reconciler) Pass(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, st *dependent.State, ccp *coderv1alpha1.CoderControlPlane, cl *codersdk.Client) (ctrl.Result, error) {
	proxies, err := cl.WorkspaceProxies(ctx)
	if ok, res, err := st.Offered(ccp, feature, "list workspace proxies", err); !ok {
		return res, err
	}

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
			return st.CredentialsFailed("register workspace proxy", err)
		}
		st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, coderv1alpha1.ReasonRegistered,
			fmt.Sprintf("workspace proxy %q is registered; its token is stored in Secret %s", proxyName(obj), cred.ref.Name), "")
	}
	obj.Status.ProxyID = cred.proxyID
	obj.Status.TokenSecretRef = &cred.ref
	obj.Status.URL = obj.Spec.AccessURL

	return st.Deployed(r.applyWorkload(ctx, obj, ccp, cred))
}
