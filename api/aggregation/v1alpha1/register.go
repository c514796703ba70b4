package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the aggregated resources.
const GroupName = "aggregation.coder.com"

// SchemeGroupVersion is the served version.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder registers the types, plus the field label conversions
	// that make field selectors work. Clients use it as it is; the API
	// server also registers the types as its internal version.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes, addFieldLabelConversions, addLogOptionsConversion)
	// AddToScheme adds the group to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns a GroupResource for resource in this group.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&CoderWorkspace{}, &CoderWorkspaceList{},
		&CoderTemplate{}, &CoderTemplateList{},
		&CoderTemplateVersion{}, &CoderTemplateVersionList{},
		&CoderUser{}, &CoderUserList{},
		&CoderGroup{}, &CoderGroupList{},
		&CoderOrganization{}, &CoderOrganizationList{},
		&CoderLogOptions{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
