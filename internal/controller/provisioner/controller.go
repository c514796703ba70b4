// Package provisioner reconciles CoderProvisioner: external provisioner
// daemons (`coder provisioner start`) for a CoderControlPlane, authenticated
// with a provisioner key the operator issues through the Coder API.
//
// What it does for each CoderProvisioner:
//   - resolves the CoderControlPlane (same namespace) and acts on its coderd
//     as the operator (coderapi.ForControlPlane);
//   - resolves the organization by name (status.organizationID) and issues
//     a provisioner key bound to spec.tags, stored in a Secret the CR owns
//     (key "key"); the Secret's annotations record what the key was issued
//     for, and a change of tags or organization rotates the key: the old key
//     is revoked, a new one issued, the Secret updated, and the Deployment
//     rolled through a pod-template annotation hashing the key's identity
//     (organization, name and ID, never the key itself);
//   - runs the daemons in a Deployment (restricted security context by
//     default) reading the key from the Secret;
//   - on deletion revokes the key in Coder (finalizer coder.com/provisioner-key),
//     best effort and bounded in time (see CleanupTimeout);
//   - on an open-source coderd, or one whose license lacks external
//     provisioner daemons, reports FeatureSupported=False with Coder's message
//     and phase Unsupported, creates nothing and checks again every
//     UnsupportedRequeue.
//
// The tags are bound to the key in Coder: `coder provisioner start` refuses
// --tag/CODER_PROVISIONERD_TAGS together with a key, so the Deployment does
// not set them.
package provisioner

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
	// Finalizer holds a CoderProvisioner until its key is revoked in Coder.
	Finalizer = "coder.com/provisioner-key"
	// ControlPlaneRefIndex indexes CoderProvisioners by
	// spec.controlPlaneRef.name.
	ControlPlaneRefIndex = dependent.ControlPlaneRefIndex
	// DefaultImage runs the daemons when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultOrganization is used when spec.organization is empty.
	DefaultOrganization = "coder"
	// DefaultCleanupTimeout bounds how long deletion waits for the key's
	// revocation in Coder.
	DefaultCleanupTimeout = dependent.DefaultCleanupTimeout

	// UnsupportedRequeue is how often a coderd without the feature is asked
	// again (a license may be added).
	UnsupportedRequeue = 10 * time.Minute
	// SteadyRequeue re-checks, when everything is ready, that the key still
	// exists in Coder.
	SteadyRequeue = 10 * time.Minute

	controllerName = "coderprovisioner"
)

// Event reasons that are not condition reasons.
const (
	EventKeyIssued           = "KeyIssued"
	EventKeyRotated          = "KeyRotated"
	EventKeyRevoked          = "KeyRevoked"
	EventKeyRevocationFailed = "KeyRevocationFailed"
)

// Reconciler reconciles CoderProvisioner objects. Base.DefaultImage runs
// the daemons when spec.image is empty; Base.CleanupTimeout bounds how
// long deletion waits for the key's revocation before the finalizer is
// removed anyway with a Warning event naming the key to revoke by hand.
type Reconciler struct {
	dependent.Base
}

// +kubebuilder:rbac:groups=coder.com,resources=coderprovisioners,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=coder.com,resources=coderprovisioners/status,verbs=update
// +kubebuilder:rbac:groups=coder.com,resources=coderprovisioners/finalizers,verbs=update
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the reconciler: it watches CoderProvisioners,
// the Deployments and Secrets they own (Secrets as metadata only, so their
// data is never cached), and the CoderControlPlanes they reference.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b, err := r.NewController(mgr, dependent.Controller{
		Name:    controllerName,
		Kind:    "CoderProvisioner",
		Object:  &coderv1alpha1.CoderProvisioner{},
		NewList: func() client.ObjectList { return &coderv1alpha1.CoderProvisionerList{} },
		ControlPlaneRef: func(o client.Object) string {
			if p, ok := o.(*coderv1alpha1.CoderProvisioner); ok {
				return p.Spec.ControlPlaneRef.Name
			}
			return ""
		},
	})
	if err != nil {
		return err
	}
	return b.Owns(&appsv1.Deployment{}).
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Complete(r)
}

// Reconcile brings one CoderProvisioner to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderProvisioner
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !obj.DeletionTimestamp.IsZero() {
		return r.Finalize(ctx, &obj, r.keyCleanup(&obj))
	}
	st := dependent.NewState(&obj, &obj.Status)
	res, err := r.reconcile(ctx, &obj, st)
	return r.Kit().Finish(ctx, st.Status, res, err)
}

// reconcile is one pass over obj, whose status st builds.
func (r *Reconciler) reconcile(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, st *dependent.State) (ctrl.Result, error) {
	ccp, cl, res, err := r.ControlPlane(ctx, st, obj.Spec.ControlPlaneRef.Name)
	if cl == nil {
		return res, err
	}
	// A client per pass: its connections are not reused by the next.
	defer coderapi.CloseIdle(cl)

	orgName := obj.Spec.Organization
	if orgName == "" {
		orgName = DefaultOrganization
	}
	org, err := cl.OrganizationByName(ctx, orgName)
	if err != nil {
		if coderapi.IsNotFound(err) {
			st.SetControlPlaneReady(ccp)
			st.Failed(coderv1alpha1.ConditionCredentialsReady, coderv1alpha1.ReasonOrganizationNotFound,
				fmt.Sprintf("organization %q: %s", orgName, coderapi.Message(err)))
			return ctrl.Result{RequeueAfter: dependent.FailedRequeue}, nil
		}
		return ctrl.Result{}, st.CoderError(fmt.Sprintf("get organization %q", orgName), err)
	}
	st.SetControlPlaneReady(ccp)
	obj.Status.OrganizationID = org.ID.String()

	keys, err := cl.ListProvisionerKeys(ctx, org.ID)
	if st.Unsupported(err, "external provisioner daemons (provisioner keys)") {
		return ctrl.Result{RequeueAfter: UnsupportedRequeue}, nil
	}
	if err != nil {
		return ctrl.Result{}, st.CoderError("list provisioner keys", err)
	}
	st.Supported("external provisioner daemons")

	// The finalizer goes on before anything exists in Coder, so nothing
	// issued there can outlive the object unnoticed.
	if err := r.EnsureFinalizer(ctx, obj, Finalizer); err != nil {
		return ctrl.Result{}, err
	}

	id, err := r.ensureKey(ctx, obj, st, cl, org.ID, keys)
	if err != nil {
		if st.Conflict(coderv1alpha1.ConditionCredentialsReady, err) {
			return ctrl.Result{RequeueAfter: dependent.FailedRequeue}, nil
		}
		return ctrl.Result{}, st.CoderError("provisioner key", err)
	}
	obj.Status.KeyName = id.Name
	obj.Status.KeySecretRef = &coderv1alpha1.SecretKeyReference{Name: keySecretName(obj), Key: KeySecretKey}
	st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, coderv1alpha1.ReasonKeyReady,
		fmt.Sprintf("provisioner key %q is stored in Secret %s", id.Name, keySecretName(obj)), "")

	dep, err := r.applyDeployment(ctx, obj, ccp, id)
	if err != nil {
		if st.Conflict(coderv1alpha1.ConditionAvailable, err) {
			return ctrl.Result{RequeueAfter: dependent.FailedRequeue}, nil
		}
		return ctrl.Result{}, fmt.Errorf("apply Deployment: %w", err)
	}
	st.SetAvailability(dep)
	return ctrl.Result{RequeueAfter: SteadyRequeue}, nil
}
