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
//     best effort and bounded in time (see dependent.Base.CleanupTimeout);
//   - on an open-source coderd, or one whose license lacks external
//     provisioner daemons, reports FeatureSupported=False with Coder's message
//     and phase Unsupported, creates nothing and checks again every
//     dependent.UnsupportedRequeue.
//
// The tags are bound to the key in Coder: `coder provisioner start` refuses
// --tag/CODER_PROVISIONERD_TAGS together with a key, so the Deployment does
// not set them.
package provisioner

import (
	"cmp"
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

const (
	// Finalizer holds a CoderProvisioner until its key is revoked in Coder.
	Finalizer = "coder.com/provisioner-key"
	// DefaultImage runs the daemons when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultOrganization is used when spec.organization is empty.
	DefaultOrganization = "coder"
)

// Event reasons that are not condition reasons.
const (
	EventKeyIssued           = "KeyIssued"
	EventKeyRotated          = "KeyRotated"
	EventKeyRevoked          = "KeyRevoked"
	EventKeyRevocationFailed = "KeyRevocationFailed"
)

// feature is what FeatureSupported reports on.
var feature = dependent.Feature{Name: "external provisioner daemons", Missing: "external provisioner daemons (provisioner keys)"}

// Reconciler reconciles CoderProvisioner objects (a dependent.Kind).
// Base.DefaultImage runs the daemons when spec.image is empty;
// Base.CleanupTimeout bounds how long deletion waits for the key's
// revocation before the finalizer is removed anyway with a Warning event
// naming the key to revoke by hand.
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

// SetupWithManager registers the reconciler (dependent.Setup): it watches
// CoderProvisioners, the Deployments and Secrets they own, and the
// CoderControlPlanes they reference.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return dependent.Setup(mgr, &r.Base, r, dependent.Controller{Object: &coderv1alpha1.CoderProvisioner{}})
}

// Reconcile brings one CoderProvisioner to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderProvisioner
	return dependent.Reconcile(ctx, &r.Base, r, req, &obj, &obj.Status)
}

// Pass resolves the organization, issues the key and runs the daemons.
func (r *Reconciler) Pass(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, st *dependent.State, ccp *coderv1alpha1.CoderControlPlane, cl *codersdk.Client) (ctrl.Result, error) {
	orgName := cmp.Or(obj.Spec.Organization, DefaultOrganization)
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
	if ok, res, err := st.Offered(ccp, feature, "list provisioner keys", err); !ok {
		return res, err
	}

	// The finalizer goes on before anything exists in Coder, so nothing
	// issued there can outlive the object unnoticed.
	if err := r.EnsureFinalizer(ctx, obj, Finalizer); err != nil {
		return ctrl.Result{}, err
	}
	id, err := r.ensureKey(ctx, obj, st, cl, org.ID, keys)
	if err != nil {
		return st.CredentialsFailed("provisioner key", err)
	}
	obj.Status.KeyName = id.Name
	obj.Status.KeySecretRef = &coderv1alpha1.SecretKeyReference{Name: keySecretName(obj), Key: KeySecretKey}
	st.SetCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, coderv1alpha1.ReasonKeyReady,
		fmt.Sprintf("provisioner key %q is stored in Secret %s", id.Name, keySecretName(obj)), "")

	return st.Deployed(r.applyDeployment(ctx, obj, ccp, id))
}
