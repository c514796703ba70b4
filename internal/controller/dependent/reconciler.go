// Package dependent holds what the reconcilers of the kinds that depend on
// a CoderControlPlane (CoderProvisioner, CoderWorkspaceProxy) share beyond
// the kit of package reconcile: the skeleton of their controllers and
// passes (Setup, Reconcile; a kind implements Kind with what differs),
// the conditions and phases they report alike, the resolution of the
// referenced control plane and the watch that reconciles its dependents
// when it changes, the Secret holding the credential each issues in Coder,
// and the cleanup in Coder behind their finalizers (the kit bounds it in
// time).
//
// The RBAC markers for what this code does stay in the reconciler packages
// that use it, so that each reconciler states its own permissions.
package dependent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coder/coder/v2/codersdk"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
	"github.com/coder/coder-k8s/internal/metrics"
)

const (
	// DefaultCleanupTimeout bounds how long deletion waits for the cleanup
	// in Coder when Base.CleanupTimeout is zero.
	DefaultCleanupTimeout = 5 * time.Minute

	// ControlPlaneMissingRequeue is a safety net: the CoderControlPlane
	// watch reconciles as soon as the control plane appears.
	ControlPlaneMissingRequeue = 2 * time.Minute
	// AccessNotReadyRequeue re-checks an object waiting for something it
	// reads (the operator's access, a Secret).
	AccessNotReadyRequeue = time.Minute
	// FailedRequeue re-checks an object that needs a change to make
	// progress (a conflict, a missing organization).
	FailedRequeue = 5 * time.Minute
)

// Base is what a dependent kind's reconciler is given: its clients, its
// events recorder and its tunables. The reconcilers embed it.
type Base struct {
	Client client.Client
	// APIReader reads Secrets without caching them cluster-wide.
	APIReader client.Reader
	Scheme    *runtime.Scheme
	// Recorder is the manager's events recorder (mgr.GetEventRecorder).
	Recorder events.EventRecorder
	// CoderTimeout bounds each call to coderd.
	CoderTimeout time.Duration
	// DefaultImage runs the workload when spec.image is empty.
	DefaultImage string
	// CleanupTimeout bounds, from the deletion request, how long deletion
	// waits for the cleanup in Coder (what the object created there) while
	// coderd is unreachable or the operator's access is not ready; then
	// the finalizer is removed anyway with a Warning event naming what to
	// delete by hand. Zero means DefaultCleanupTimeout.
	CleanupTimeout time.Duration
}

// Image is the image the workload runs: spec.image, else DefaultImage.
func (b *Base) Image(specImage string) string {
	return cmp.Or(specImage, b.DefaultImage, coderv1alpha1.DefaultImage)
}

// cleanupTimeout is CleanupTimeout when positive, else the default.
func (b *Base) cleanupTimeout() time.Duration {
	return cmp.Or(max(b.CleanupTimeout, 0), DefaultCleanupTimeout)
}

// ControlPlane resolves the CoderControlPlane called name in the
// namespace of st's object, and a Coder client acting as the operator on
// it. When it returns a nil client it has set the ControlPlaneReady
// condition and the phase, and the result and error are the reconcile's.
func (b *Base) ControlPlane(ctx context.Context, st *State, name string) (*coderv1alpha1.CoderControlPlane, *codersdk.Client, ctrl.Result, error) {
	ns := st.obj.GetNamespace()
	ccp, sdk, err := b.connect(ctx, ns, name)
	switch {
	case ccp == nil && apierrors.IsNotFound(err):
		st.Waiting(coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ReasonControlPlaneNotFound,
			fmt.Sprintf("CoderControlPlane %q not found in namespace %s", name, ns))
		return nil, nil, ctrl.Result{RequeueAfter: ControlPlaneMissingRequeue}, nil
	case ccp == nil:
		return nil, nil, ctrl.Result{}, fmt.Errorf("get CoderControlPlane %s: %w", name, err)
	case err != nil:
		st.Waiting(coderv1alpha1.ConditionControlPlaneReady, coderv1alpha1.ReasonOperatorAccessNotReady, err.Error())
		if errors.Is(err, coderapi.ErrAccessNotReady) {
			return nil, nil, ctrl.Result{RequeueAfter: AccessNotReadyRequeue}, nil
		}
		return nil, nil, ctrl.Result{}, err
	}
	return ccp, sdk, ctrl.Result{}, nil
}

// connect reads the CoderControlPlane called name in namespace and makes
// a Coder client acting as the operator on its coderd. A nil control
// plane means it could not be read (err); a nil client with it, that the
// operator's access to it is not usable (err).
func (b *Base) connect(ctx context.Context, namespace, name string) (*coderv1alpha1.CoderControlPlane, *codersdk.Client, error) {
	var ccp coderv1alpha1.CoderControlPlane
	if err := b.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &ccp); err != nil {
		return nil, nil, err
	}
	sdk, err := coderapi.ForControlPlane(ctx, b.APIReader, &ccp, b.CoderTimeout, metrics.ComponentController)
	if err != nil {
		return &ccp, nil, err
	}
	return &ccp, sdk, nil
}

// EnsureFinalizer adds finalizer to obj (one patch, only when missing).
func (b *Base) EnsureFinalizer(ctx context.Context, obj client.Object, finalizer string) error {
	return reconcile.AddFinalizers(ctx, b.Client, obj, finalizer)
}

// Kit is what the reconciler writes status, events and finalizers with.
func (b *Base) Kit() reconcile.Kit {
	return reconcile.Kit{Client: b.Client, Recorder: b.Recorder}
}
