package provisioner

import (
	"context"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

// keyCleanup revokes the object's provisioner key in Coder on deletion,
// best effort and bounded (dependent.Base.Finalize): the finalizer goes
// after CleanupTimeout, or at once when the CoderControlPlane no longer
// exists, with a Warning event naming the key to revoke by hand.
func (r *Reconciler) keyCleanup(obj *coderv1alpha1.CoderProvisioner) dependent.Cleanup {
	return dependent.Cleanup{
		Finalizer:    Finalizer,
		ControlPlane: obj.Spec.ControlPlaneRef.Name,
		Find: func(ctx context.Context) (string, dependent.UndoFunc, error) {
			return r.issuedKey(ctx, obj)
		},
		Name:         "revoke the provisioner key",
		Action:       "RevokeKey",
		DoneReason:   EventKeyRevoked,
		FailedReason: EventKeyRevocationFailed,
		Done:         "revoked %s",
		GaveUp:       "gave up revoking %[1]s after %[2]s: %[3]s; revoke it in Coder by hand",
		Abandoned:    "cannot revoke %[1]s: %[2]s; revoke it in Coder by hand",
	}
}

// issuedKey names the key the object holds in Coder and how to revoke it;
// a nil revoke means none was issued. The key Secret's annotations win
// over the status, which may lag behind an issue.
func (r *Reconciler) issuedKey(ctx context.Context, obj *coderv1alpha1.CoderProvisioner) (string, dependent.UndoFunc, error) {
	orgID, name := obj.Status.OrganizationID, obj.Status.KeyName
	var secret corev1.Secret
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: obj.Namespace, Name: keySecretName(obj)}, &secret)
	switch {
	case err == nil && metav1.IsControlledBy(&secret, obj) && secret.Annotations[AnnotationKeyName] != "":
		orgID, name = secret.Annotations[AnnotationKeyOrganizationID], secret.Annotations[AnnotationKeyName]
	case err != nil && !apierrors.IsNotFound(err):
		return "", nil, fmt.Errorf("read Secret %s: %w", keySecretName(obj), err)
	}
	org, perr := uuid.Parse(orgID)
	if name == "" || perr != nil {
		return "", nil, nil
	}
	revoke := func(ctx context.Context, cl *codersdk.Client) error {
		return cl.DeleteProvisionerKey(ctx, org, name)
	}
	return fmt.Sprintf("provisioner key %q in organization %s", name, orgID), revoke, nil
}
