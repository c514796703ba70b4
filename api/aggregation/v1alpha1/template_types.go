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
	// Variables are the values of the template's Terraform variables for
	// the version that spec.files builds. What is listed is what that
	// version gets: a variable not listed gets its default, never the
	// value an earlier version had. Changing them builds a new version of
	// the same files. Each name must be a variable the files declare.
	// +optional
	// +listType=map
	// +listMapKey=name
	Variables []TemplateVariable `json:"variables,omitempty"`
}

// TemplateVariable is one Terraform variable's value: given literally, or
// read from a Secret of the object's namespace when the version is
// built, so that no credential has to sit in the object.
type TemplateVariable struct {
	// Name is the Terraform variable's name.
	Name string `json:"name"`
	// Value is the variable's value (a string; numbers, booleans and
	// lists in their Terraform string form). A variable the files mark
	// sensitive takes its value from a Secret instead.
	// +optional
	Value string `json:"value,omitempty"`
	// ValueFrom reads the value from a Secret. The caller must be allowed
	// to get that Secret.
	// +optional
	ValueFrom *TemplateVariableSource `json:"valueFrom,omitempty"`
}

// TemplateVariableSource is where a variable's value comes from.
type TemplateVariableSource struct {
	// SecretKeyRef selects a key of a Secret in the object's namespace.
	SecretKeyRef *SecretKeySelector `json:"secretKeyRef"`
}

// SecretKeySelector selects a key of a Secret in the object's namespace.
type SecretKeySelector struct {
	// Name is the Secret's name.
	Name string `json:"name"`
	// Key is the key of the Secret's data.
	Key string `json:"key"`
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
	// Variables are the Terraform variables of the version spec.files
	// shows (the one building, else the active one), as Coder reports
	// them, with the Secret revision each value taken from a Secret was
	// read at. Never a value.
	// +optional
	// +listType=map
	// +listMapKey=name
	Variables []TemplateVariableStatus `json:"variables,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (the active version built successfully) and,
	// when a variable's value came from a Secret, SecretsCurrent.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TemplateVariableStatus describes one Terraform variable of a template
// version.
type TemplateVariableStatus struct {
	// Name is the variable's name.
	Name string `json:"name"`
	// Type is its Terraform type: string, number, bool or a complex
	// type's JSON form.
	// +optional
	Type string `json:"type,omitempty"`
	// Required says the files give it no default.
	// +optional
	Required bool `json:"required,omitempty"`
	// Sensitive says Coder keeps its value secret (it shows *redacted*).
	// +optional
	Sensitive bool `json:"sensitive,omitempty"`
	// Default says the version has the variable's default value.
	// +optional
	Default bool `json:"default,omitempty"`
	// SecretKeyRef is the Secret the value was read from, when it was.
	// +optional
	SecretKeyRef *SecretKeySelector `json:"secretKeyRef,omitempty"`
	// SecretResourceVersion is that Secret's resourceVersion when the
	// value was read.
	// +optional
	SecretResourceVersion string `json:"secretResourceVersion,omitempty"`
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
