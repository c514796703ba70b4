// Package controller registers the reconcilers of the coder.com/v1alpha1
// kinds with a controller-runtime manager: CoderControlPlane
// (controlplane, with operatoraccess for the Coder API side),
// CoderProvisioner (provisioner) and CoderWorkspaceProxy (workspaceproxy).
package controller

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/coder/coder-k8s/internal/controller/controlplane"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/controller/provisioner"
	"github.com/coder/coder-k8s/internal/controller/workspaceproxy"
)

// Options tunes the reconcilers.
type Options struct {
	// CoderRequestTimeout bounds each call to coderd.
	CoderRequestTimeout time.Duration
	// OperatorAccessCheckInterval is how often each control plane's coderd
	// and operator token are checked; 0 means the access manager's default.
	OperatorAccessCheckInterval time.Duration
	// ReplacedTokenRevocationDelay is how long a replaced operator token
	// keeps working; 0 means the access manager's default.
	ReplacedTokenRevocationDelay time.Duration
	// AccessRechecks names control planes whose operator token was seen
	// rejected by coderd; each gets an access check at once. Optional.
	AccessRechecks <-chan event.TypedGenericEvent[types.NamespacedName]
	// WorkspaceRBAC is what a control plane's spec.workspaceRBAC may ask
	// for; nil means controlplane.DefaultWorkspaceRBACPolicy.
	WorkspaceRBAC *controlplane.WorkspaceRBACPolicy
}

// Setup registers every reconciler with mgr. Reconcilers run only on the
// replica holding the leader lease.
func Setup(mgr ctrl.Manager, opts Options) error {
	access := &operatoraccess.Manager{
		Client:              mgr.GetClient(),
		APIReader:           mgr.GetAPIReader(),
		Recorder:            mgr.GetEventRecorder("operator-access"),
		Timeout:             opts.CoderRequestTimeout,
		ValidateEvery:       opts.OperatorAccessCheckInterval,
		RevokeReplacedAfter: opts.ReplacedTokenRevocationDelay,
	}
	if err := (&controlplane.Reconciler{Access: access, Rechecks: opts.AccessRechecks, WorkspaceRBAC: opts.WorkspaceRBAC}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("CoderControlPlane controller: %w", err)
	}
	// base is what the reconcilers of the kinds that reference a control
	// plane are given; each records events under its own name.
	base := func(recorder, image string) dependent.Base {
		return dependent.Base{
			Client:       mgr.GetClient(),
			APIReader:    mgr.GetAPIReader(),
			Scheme:       mgr.GetScheme(),
			Recorder:     mgr.GetEventRecorder(recorder),
			CoderTimeout: opts.CoderRequestTimeout,
			DefaultImage: image,
		}
	}
	if err := (&provisioner.Reconciler{
		Base: base("coderprovisioner-controller", provisioner.DefaultImage),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("CoderProvisioner controller: %w", err)
	}
	if err := (&workspaceproxy.Reconciler{
		Base: base("coderworkspaceproxy-controller", workspaceproxy.DefaultImage),
	}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("CoderWorkspaceProxy controller: %w", err)
	}
	return nil
}
