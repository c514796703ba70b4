package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderTemplate is a Coder template seen through Kubernetes. Its name is
// <organization>.<template>, or <control plane>.<organization>.<template>
// when the namespace has more than one control plane; coderd stores it.
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired template.
	Spec CoderTemplateSpec `json:"spec,omitempty"`
	// Status is the template as coderd reports it.
	// +optional
	Status CoderTemplateStatus `json:"status,omitempty"`
}

// CoderTemplateSpec is what a user sets on a template.
type CoderTemplateSpec struct {
	// Organization is the Coder organization name. It is part of the
	// object name; when set it must agree with it.
	// +optional
	Organization string `json:"organization,omitempty"`
	// DisplayName is the name shown in the Coder dashboard.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// Description says what the template is for.
	// +optional
	Description string `json:"description,omitempty"`
	// Icon is a URL or a path such as /icon/go.svg.
	// +optional
	Icon string `json:"icon,omitempty"`
	// VersionID is the active template version (a UUID). Setting it to
	// another existing version of the template promotes that version.
	// +optional
	VersionID string `json:"versionID,omitempty"`
	// Files is the template source of the active version: path relative to
	// the template root → file content. Changing it uploads a new version,
	// waits for its build and promotes it. Limits: 1000 files, 1 MiB per
	// file, 4 MiB in total; paths are relative and stay inside the root.
	// +optional
	Files map[string]string `json:"files,omitempty"`
}

// CoderTemplateStatus is the template as coderd reports it.
type CoderTemplateStatus struct {
	// ID is the Coder template ID.
	// +optional
	ID string `json:"id,omitempty"`
	// Organization is the Coder organization name.
	// +optional
	Organization string `json:"organization,omitempty"`
	// OrganizationID is the Coder organization ID.
	// +optional
	OrganizationID string `json:"organizationID,omitempty"`
	// ActiveVersionID is the version new workspaces are built from.
	// +optional
	ActiveVersionID string `json:"activeVersionID,omitempty"`
	// ActiveVersionName is that version's name.
	// +optional
	ActiveVersionName string `json:"activeVersionName,omitempty"`
	// BuildStatus is the status of the active version's template import
	// job: pending, running, succeeded, canceling, canceled or failed.
	// +optional
	BuildStatus string `json:"buildStatus,omitempty"`
	// BuildError is that job's error message when it failed.
	// +optional
	BuildError string `json:"buildError,omitempty"`
	// BuildingVersionID is the version built from the spec.files last
	// applied while it builds in the background, or after its build
	// failed; it becomes the active version once it succeeds. Empty when
	// the active version is the one applied.
	// +optional
	BuildingVersionID string `json:"buildingVersionID,omitempty"`
	// Deprecated reports that the template is deprecated.
	// +optional
	Deprecated bool `json:"deprecated,omitempty"`
	// DeprecationMessage says why, when Deprecated.
	// +optional
	DeprecationMessage string `json:"deprecationMessage,omitempty"`
	// ActiveUserCount is how many users used the template recently.
	// +optional
	ActiveUserCount int32 `json:"activeUserCount,omitempty"`
	// UpdatedAt is when coderd last changed the template.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (the active version built successfully).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CoderTemplateList is a list of templates.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderTemplate `json:"items"`
}
