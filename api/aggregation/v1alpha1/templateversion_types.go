package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderTemplateVersion is one version of a Coder template seen through
// Kubernetes. Its name is <organization>.<template>.<version>, or
// <control plane>.<organization>.<template>.<version> when the namespace
// has more than one control plane. Coder version names may contain dots
// (v1.2.3): everything after the template part is the version name, and
// whether the first part is a control plane is decided by the namespace
// (prefixed exactly when it has several control planes). Creating one
// uploads a staging version that builds in the background and is never
// made active by itself; deleting one archives it in Coder.
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderTemplateVersion struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the version as uploaded.
	Spec CoderTemplateVersionSpec `json:"spec,omitempty"`
	// Status is the version as coderd reports it.
	// +optional
	Status CoderTemplateVersionStatus `json:"status,omitempty"`
}

// CoderTemplateVersionSpec is what a user sets on a template version.
// Only spec.message can change after a create: a version's files,
// variables and provisioner tags are what coderd built, and a version's
// name is its object name.
type CoderTemplateVersionSpec struct {
	// Organization is the Coder organization name. It is part of the
	// object name; when set it must agree with it.
	// +optional
	Organization string `json:"organization,omitempty"`
	// Template is the Coder template's name. It is part of the object
	// name; when set it must agree with it.
	// +optional
	Template string `json:"template,omitempty"`
	// Message describes the version (Coder's version message).
	// +optional
	Message string `json:"message,omitempty"`
	// Files is the version's source: path relative to the template root
	// → file content, with the limits of CoderTemplate's spec.files.
	// Required on create; shown to those who may update every template of
	// the organization.
	// +optional
	Files map[string]string `json:"files,omitempty"`
	// Variables are the values of the version's Terraform variables, as
	// CoderTemplate's spec.variables: what is listed is what the version
	// gets, every other declared variable gets its default.
	// +optional
	// +listType=map
	// +listMapKey=name
	Variables []TemplateVariable `json:"variables,omitempty"`
	// ProvisionerTags select the provisioners that build the version.
	// coderd adds scope and owner when they are not given; those
	// defaults (scope organization, no owner) are not shown.
	// +optional
	ProvisionerTags map[string]string `json:"provisionerTags,omitempty"`
}

// CoderTemplateVersionStatus is the version as coderd reports it.
type CoderTemplateVersionStatus struct {
	// ID is the Coder template version ID.
	// +optional
	ID string `json:"id,omitempty"`
	// TemplateID is the Coder template ID.
	// +optional
	TemplateID string `json:"templateID,omitempty"`
	// OrganizationID is the Coder organization ID.
	// +optional
	OrganizationID string `json:"organizationID,omitempty"`
	// CreatedBy is the Coder username of the version's author.
	// +optional
	CreatedBy string `json:"createdBy,omitempty"`
	// CreatedAt is when coderd created the version.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
	// BuildStatus is the status of the version's import job: pending,
	// running, succeeded, canceling, canceled or failed.
	// +optional
	BuildStatus string `json:"buildStatus,omitempty"`
	// BuildError is that job's error message when it failed.
	// +optional
	BuildError string `json:"buildError,omitempty"`
	// Active says the version is its template's active version.
	// +optional
	Active bool `json:"active,omitempty"`
	// Variables are the version's Terraform variables as Coder reports
	// them (never a value).
	// +optional
	// +listType=map
	// +listMapKey=name
	Variables []TemplateVariableStatus `json:"variables,omitempty"`
	// Parameters are the rich parameters the version declares, once its
	// build has ended.
	// +optional
	// +listType=map
	// +listMapKey=name
	Parameters []TemplateParameter `json:"parameters,omitempty"`
	// Presets are the version's presets, once its build has ended.
	// +optional
	// +listType=map
	// +listMapKey=name
	Presets []TemplatePreset `json:"presets,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (True once the version built; False with reason
	// Building or BuildFailed and coderd's error) and, when a variable's
	// value came from a Secret, SecretsCurrent.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CoderTemplateVersionList is a list of template versions.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderTemplateVersionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderTemplateVersion `json:"items"`
}
