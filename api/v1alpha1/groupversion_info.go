// Package v1alpha1 holds the coder.com/v1alpha1 API: CoderControlPlane,
// CoderProvisioner and CoderWorkspaceProxy, reconciled by coder-k8s's
// controller.
//
// +kubebuilder:object:generate=true
// +groupName=coder.com
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "coder.com", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
