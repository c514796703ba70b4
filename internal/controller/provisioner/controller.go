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
	// Finalizer holds a CoderProvisioner until its key is revoked in Coder.
	Finalizer = "coder.com/provisioner-key"
	// ControlPlaneRefIndex indexes CoderProvisioners by
	// spec.controlPlaneRef.name.
	ControlPlaneRefIndex = "spec.controlPlaneRef.name"
	// DefaultImage runs the daemons when spec.image is empty.
	DefaultImage = coderv1alpha1.DefaultImage
	// DefaultOrganization is used when spec.organization is empty.
	DefaultOrganization = "coder"
	// DefaultCleanupTimeout bounds how long deletion waits for the key's
	// revocation in Coder.
	DefaultCleanupTimeout = 5 * time.Minute

	// UnsupportedRequeue is how often a coderd without the feature is asked
	// again (a license may be added).
	UnsupportedRequeue = 10 * time.Minute
	// SteadyRequeue re-checks, when everything is ready, that the key still
	// exists in Coder.
	SteadyRequeue = 10 * time.Minute
	// controlPlaneMissingRequeue is a safety net: the CoderControlPlane
	// watch reconciles as soon as it appears.
	controlPlaneMissingRequeue = 2 * time.Minute
	accessNotReadyRequeue      = time.Minute
	failedRequeue              = 5 * time.Minute
	cleanupRetry               = 10 * time.Second

	fieldOwner     = "coder-k8s"
	controllerName = "coderprovisioner"
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
	ReasonKeyReady               = "KeyReady"
	ReasonOrganizationNotFound   = "OrganizationNotFound"
	ReasonSecretConflict         = "SecretConflict"
	ReasonDeploymentConflict     = "DeploymentConflict"
	ReasonReplicasReady          = "ReplicasReady"
	ReasonReplicasNotReady       = "ReplicasNotReady"
	ReasonScaledToZero           = "ScaledToZero"
	ReasonReconciling            = "Reconciling"
)

// Event reasons that are not condition reasons.
const (
	EventKeyIssued           = "KeyIssued"
	EventKeyRotated          = "KeyRotated"
	EventKeyRevoked          = "KeyRevoked"
	EventKeyRevocationFailed = "KeyRevocationFailed"
)

// Reconciler reconciles CoderProvisioner objects.
type Reconciler struct {
	Client client.Client
	// APIReader reads Secrets without caching them cluster-wide.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	// Recorder is the manager's events recorder (mgr.GetEventRecorder).
	Recorder events.EventRecorder
	// CoderTimeout bounds each call to coderd.
	CoderTimeout time.Duration
	// DefaultImage runs the daemons when spec.image is empty.
	DefaultImage string
	// CleanupTimeout bounds, from the deletion request, how long deletion
	// waits for the key's revocation while coderd is unreachable or the
	// operator's access is not ready; then the finalizer is removed anyway
	// with a Warning event naming the key to revoke by hand. Zero means
	// DefaultCleanupTimeout.
	CleanupTimeout time.Duration
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
	if r.DefaultImage == "" {
		r.DefaultImage = DefaultImage
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &coderv1alpha1.CoderProvisioner{}, ControlPlaneRefIndex,
		func(o client.Object) []string {
			p, ok := o.(*coderv1alpha1.CoderProvisioner)
			if !ok || p.Spec.ControlPlaneRef.Name == "" {
				return nil
			}
			return []string{p.Spec.ControlPlaneRef.Name}
		}); err != nil {
		return fmt.Errorf("index CoderProvisioner by %s: %w", ControlPlaneRefIndex, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		// Status writes and finalizer patches do not change the generation:
		// they must not trigger another reconcile.
		For(&coderv1alpha1.CoderProvisioner{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Secret{}, builder.OnlyMetadata).
		Watches(&coderv1alpha1.CoderControlPlane{},
			handler.EnqueueRequestsFromMapFunc(r.requestsForControlPlane),
			builder.WithPredicates(controlPlaneAccessChanged())).
		Complete(r)
}

// requestsForControlPlane maps a CoderControlPlane to the CoderProvisioners
// referencing it.
func (r *Reconciler) requestsForControlPlane(ctx context.Context, o client.Object) []reconcile.Request {
	var list coderv1alpha1.CoderProvisionerList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()),
		client.MatchingFields{ControlPlaneRefIndex: o.GetName()}); err != nil {
		logf.FromContext(ctx).Error(err, "list CoderProvisioners for control plane", "controlPlane", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, p := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
	}
	return reqs
}

// controlPlaneAccessChanged passes creations, deletions and the updates of
// a CoderControlPlane that change how the operator reaches its coderd.
func controlPlaneAccessChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*coderv1alpha1.CoderControlPlane)
			n, ok2 := e.ObjectNew.(*coderv1alpha1.CoderControlPlane)
			if !ok1 || !ok2 {
				return true
			}
			return o.Status.URL != n.Status.URL ||
				!equality.Semantic.DeepEqual(o.Status.OperatorTokenSecretRef, n.Status.OperatorTokenSecretRef) ||
				apimeta.IsStatusConditionTrue(o.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) !=
					apimeta.IsStatusConditionTrue(n.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) ||
				o.Spec.OperatorAccess.Disabled != n.Spec.OperatorAccess.Disabled ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
	}
}

// Reconcile brings one CoderProvisioner to its desired state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var obj coderv1alpha1.CoderProvisioner
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

	orgName := obj.Spec.Organization
	if orgName == "" {
		orgName = DefaultOrganization
	}
	org, err := cl.OrganizationByName(ctx, orgName)
	if err != nil {
		if coderapi.IsNotFound(err) {
			st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionTrue, ReasonReady, "the operator reaches coderd at "+ccp.Status.URL, "")
			st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, ReasonOrganizationNotFound,
				fmt.Sprintf("organization %q: %s", orgName, coderapi.Message(err)), corev1.EventTypeWarning)
			st.status.Phase = coderv1alpha1.PhaseFailed
			return ctrl.Result{RequeueAfter: failedRequeue}, nil
		}
		return ctrl.Result{}, st.coderError(fmt.Sprintf("get organization %q", orgName), err)
	}
	st.setCondition(coderv1alpha1.ConditionControlPlaneReady, metav1.ConditionTrue, ReasonReady, "the operator reaches coderd at "+ccp.Status.URL, "")
	st.status.OrganizationID = org.ID.String()

	keys, err := cl.ListProvisionerKeys(ctx, org.ID)
	if reason, unavailable := coderapi.FeatureUnavailable(err); unavailable {
		st.setCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionFalse, reason,
			"coderd does not offer external provisioner daemons (provisioner keys): "+coderapi.Message(err), corev1.EventTypeWarning)
		st.status.Phase = coderv1alpha1.PhaseUnsupported
		return ctrl.Result{RequeueAfter: UnsupportedRequeue}, nil
	}
	if err != nil {
		return ctrl.Result{}, st.coderError("list provisioner keys", err)
	}
	st.setCondition(coderv1alpha1.ConditionFeatureSupported, metav1.ConditionTrue, ReasonSupported, "coderd offers external provisioner daemons", "")

	// The finalizer goes on before anything exists in Coder, so nothing
	// issued there can outlive the object unnoticed.
	if err := r.ensureFinalizer(ctx, obj); err != nil {
		return ctrl.Result{}, err
	}

	id, err := r.ensureKey(ctx, st, cl, org.ID, keys)
	if err != nil {
		var conflict *conflictError
		if errors.As(err, &conflict) {
			st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionFalse, conflict.reason, conflict.Error(), corev1.EventTypeWarning)
			st.status.Phase = coderv1alpha1.PhaseFailed
			return ctrl.Result{RequeueAfter: failedRequeue}, nil
		}
		return ctrl.Result{}, st.coderError("provisioner key", err)
	}
	st.status.KeyName = id.Name
	st.status.KeySecretRef = &coderv1alpha1.SecretKeyReference{Name: keySecretName(obj), Key: KeySecretKey}
	st.setCondition(coderv1alpha1.ConditionCredentialsReady, metav1.ConditionTrue, ReasonKeyReady,
		fmt.Sprintf("provisioner key %q is stored in Secret %s", id.Name, keySecretName(obj)), "")

	dep, err := r.applyDeployment(ctx, obj, ccp, id)
	if err != nil {
		var conflict *conflictError
		if errors.As(err, &conflict) {
			st.setCondition(coderv1alpha1.ConditionAvailable, metav1.ConditionFalse, conflict.reason, conflict.Error(), corev1.EventTypeWarning)
			st.status.Phase = coderv1alpha1.PhaseFailed
			return ctrl.Result{RequeueAfter: failedRequeue}, nil
		}
		return ctrl.Result{}, fmt.Errorf("apply Deployment: %w", err)
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
func (r *Reconciler) ensureFinalizer(ctx context.Context, obj *coderv1alpha1.CoderProvisioner) error {
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
func (r *Reconciler) writeStatus(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, status coderv1alpha1.CoderProvisionerStatus) error {
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

func (r *Reconciler) image(obj *coderv1alpha1.CoderProvisioner) string {
	if obj.Spec.Image != "" {
		return obj.Spec.Image
	}
	if r.DefaultImage != "" {
		return r.DefaultImage
	}
	return DefaultImage
}
