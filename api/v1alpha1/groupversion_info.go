// Package v1alpha1 holds the coder.com/v1alpha1 API: CoderControlPlane,
// CoderProvisioner and CoderWorkspaceProxy, reconciled by coder-k8s's
// controller.
//
// +kubebuilder:object:generate=true
// +groupName=coder.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API's group and version.
	GroupVersion = schema.GroupVersion{Group: "coder.com", Version: "v1alpha1"}

	// SchemeBuilder registers the API's types with a scheme. It depends
	// only on apimachinery, so the API package stays cheap to import.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&CoderControlPlane{}, &CoderControlPlaneList{},
		&CoderProvisioner{}, &CoderProvisionerList{},
		&CoderWorkspaceProxy{}, &CoderWorkspaceProxyList{},
		&CoderObjectRecord{}, &CoderObjectRecordList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
