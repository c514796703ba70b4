package coderapi

import (
	"fmt"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// The operator token Secret is the contract between the controller that
// writes it (internal/controller/operatoraccess, one per control plane,
// in the control plane's namespace) and the components that act as the
// operator with it (ForControlPlane, the aggregated API server's
// backends). Both sides take its name, key and labels from here.

// TokenKey is the key of the operator token in its Secret.
const TokenKey = "token"

// TokenSecretName is the Secret holding the operator token of the control
// plane named controlPlane.
func TokenSecretName(controlPlane string) string { return controlPlane + "-operator-token" }

// OperatorSecretLabels are the labels of the Secrets the operator writes
// for the control plane named controlPlane: its token Secret and, when
// the operator created coderd's first user, that user's credentials.
func OperatorSecretLabels(controlPlane string) map[string]string {
	return map[string]string{
		coderv1alpha1.LabelManagedBy:    coderv1alpha1.ManagedByValue,
		coderv1alpha1.LabelControlPlane: controlPlane,
	}
}

// OperatorSecretSelector selects the Secrets labeled with
// OperatorSecretLabels, of every control plane.
func OperatorSecretSelector() (labels.Selector, error) {
	managed, err := labels.NewRequirement(coderv1alpha1.LabelManagedBy, selection.Equals, []string{coderv1alpha1.ManagedByValue})
	if err != nil {
		return nil, fmt.Errorf("operator Secret selector: %w", err)
	}
	owned, err := labels.NewRequirement(coderv1alpha1.LabelControlPlane, selection.Exists, nil)
	if err != nil {
		return nil, fmt.Errorf("operator Secret selector: %w", err)
	}
	return labels.NewSelector().Add(*managed, *owned), nil
}
