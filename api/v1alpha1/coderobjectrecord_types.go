package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Resources a CoderObjectRecord can describe.
const (
	RecordResourceWorkspaces       = "coderworkspaces"
	RecordResourceTemplates        = "codertemplates"
	RecordResourceTemplateVersions = "codertemplateversions"
	RecordResourceUsers            = "coderusers"
	RecordResourceGroups           = "codergroups"
	RecordResourceOrganizations    = "coderorganizations"
)

// CoderObjectRecordSpec is what Kubernetes knows about one aggregated
// object (a coderworkspace, codertemplate or codertemplateversion) that Coder has nowhere to
// keep: its Kubernetes metadata, its generation and, for a template, the
// build in progress. The aggregated API server owns these records; users
// do not edit them.
type CoderObjectRecordSpec struct {
	// Resource is the aggregated resource: coderworkspaces,
	// codertemplates, codertemplateversions, coderusers, codergroups or
	// coderorganizations.
	// +kubebuilder:validation:Enum=coderworkspaces;codertemplates;codertemplateversions;coderusers;codergroups;coderorganizations
	Resource string `json:"resource"`
	// ControlPlane is the CoderControlPlane (in the record's namespace)
	// whose coderd holds the object; empty for the static backend.
	// +optional
	ControlPlane string `json:"controlPlane,omitempty"`
	// CoderID is the Coder object's UUID. It is empty only for a template
	// whose first version is still building (Coder has no template yet);
	// then Name identifies it.
	// +optional
	CoderID string `json:"coderID,omitempty"`
	// Name is the aggregated object's name when the record was last
	// written.
	Name string `json:"name"`
	// Generation counts changes of the object's spec.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
	// SpecHash identifies the spec that Generation counts up to, so that a
	// change made in Coder (outside Kubernetes) is counted too.
	// +optional
	SpecHash string `json:"specHash,omitempty"`
	// Labels are the object's labels, without those coder-k8s derives
	// from Coder.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations are the object's annotations.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// Finalizers hold a deletion until they are removed.
	// +optional
	Finalizers []string `json:"finalizers,omitempty"`
	// OwnerReferences let the garbage collector delete the object with
	// its owner.
	// +optional
	OwnerReferences []metav1.OwnerReference `json:"ownerReferences,omitempty"`
	// ManagedFields is the object's server-side apply field ownership.
	// Kept as given: no schema (fieldsV1 is free-form JSON, which a
	// schema would prune).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	ManagedFields []metav1.ManagedFieldsEntry `json:"managedFields,omitempty"`
	// DeletionTimestamp is set when a deletion waits for finalizers.
	// +optional
	DeletionTimestamp *metav1.Time `json:"deletionTimestamp,omitempty"`
	// Build is a template's version that is building in Coder and is
	// promoted (or the template created with it) once it succeeds.
	// +optional
	Build *TemplateBuildRecord `json:"build,omitempty"`
	// Variables are a template's Terraform variables as applied through
	// Kubernetes, for each template version they were applied to that the
	// template still shows (its active version and the one building):
	// literal values and Secret references, never a Secret's value.
	// +optional
	// +listType=map
	// +listMapKey=versionID
	Variables []TemplateVersionVariables `json:"variables,omitempty"`
	// Versions say what a template's spec gave the versions it shows
	// (its active version and the one building) besides files and
	// variables, so that a read shows spec.versionName,
	// spec.versionMessage and spec.provisionerTags only when they were
	// given.
	// +optional
	// +listType=map
	// +listMapKey=versionID
	Versions []TemplateVersionGiven `json:"versions,omitempty"`
	// Durations are a template's duration settings as last written
	// (setting's JSON name → duration, "8h"), so that a read shows them
	// as written while Coder keeps their value (Coder keeps milliseconds).
	// +optional
	Durations map[string]string `json:"durations,omitempty"`
	// Password is where a user's password was last set from: the
	// Secret key and the Secret's resourceVersion then, never the
	// password.
	// +optional
	Password *UserPasswordRecord `json:"password,omitempty"`
}

// UserPasswordRecord is the Secret a user's password was last set from.
type UserPasswordRecord struct {
	// SecretName is the Secret's name (in the record's namespace).
	SecretName string `json:"secretName"`
	// SecretKey is the key of its data.
	SecretKey string `json:"secretKey"`
	// SecretResourceVersion is the Secret's resourceVersion when the
	// password was read.
	// +optional
	SecretResourceVersion string `json:"secretResourceVersion,omitempty"`
}

// TemplateVersionVariables are the variables applied to one template
// version.
type TemplateVersionVariables struct {
	// VersionID is the template version's UUID.
	VersionID string `json:"versionID"`
	// Variables are as the spec listed them.
	// +optional
	Variables []TemplateVariableRecord `json:"variables,omitempty"`
}

// TemplateVersionGiven is what a template's spec gave one of its
// versions.
type TemplateVersionGiven struct {
	// VersionID is the template version's UUID.
	VersionID string `json:"versionID"`
	// Name says the version's name came from spec.versionName.
	// +optional
	Name bool `json:"name,omitempty"`
	// Message says the version's message came from spec.versionMessage.
	// +optional
	Message bool `json:"message,omitempty"`
	// ProvisionerTags are the tags spec.provisionerTags gave it (coderd
	// adds its own).
	// +optional
	ProvisionerTags map[string]string `json:"provisionerTags,omitempty"`
}

// TemplateVariableRecord is one variable as applied: a literal value, or
// the Secret key it was read from and that Secret's revision.
type TemplateVariableRecord struct {
	// Name is the Terraform variable's name.
	Name string `json:"name"`
	// Value is a literal value (never one read from a Secret).
	// +optional
	Value string `json:"value,omitempty"`
	// SecretName and SecretKey name the Secret key the value was read
	// from; empty for a literal value.
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// +optional
	SecretKey string `json:"secretKey,omitempty"`
	// SecretResourceVersion is that Secret's resourceVersion when it was
	// read.
	// +optional
	SecretResourceVersion string `json:"secretResourceVersion,omitempty"`
}

// TemplateBuildRecord is a template version building in the background.
type TemplateBuildRecord struct {
	// VersionID is the building template version's UUID.
	VersionID string `json:"versionID"`
	// FilesHash identifies the uploaded files, so that applying the same
	// files again reuses this version.
	FilesHash string `json:"filesHash"`
	// VariablesHash identifies the variables applied with them (Secrets
	// by revision, not value), so that applying the same variables again
	// reuses this version too.
	// +optional
	VariablesHash string `json:"variablesHash,omitempty"`
	// Organization is the Coder organization's UUID.
	Organization string `json:"organization"`
	// DisplayName, Description and Icon are the template's settings as
	// applied, for a template that Coder does not have yet.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// +optional
	Description string `json:"description,omitempty"`
	// +optional
	Icon string `json:"icon,omitempty"`
	// StartedAt is when the version was uploaded.
	StartedAt metav1.Time `json:"startedAt"`
	// Failed says the build ended without success; Error and Log say why.
	// A failed build is kept until new files are applied.
	// +optional
	Failed bool `json:"failed,omitempty"`
	// Error is Coder's error message for a failed build.
	// +optional
	Error string `json:"error,omitempty"`
	// Log is the end of a failed build's log.
	// +optional
	Log string `json:"log,omitempty"`
}

// CoderObjectRecord is the aggregated API server's record of one
// coderworkspace, codertemplate or codertemplateversion: Kubernetes metadata that Coder does
// not store, keyed by the Coder object's UUID so that a rename in Coder
// keeps it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resource`
// +kubebuilder:printcolumn:name="Object",type=string,JSONPath=`.spec.name`
// +kubebuilder:printcolumn:name="Coder ID",type=string,JSONPath=`.spec.coderID`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CoderObjectRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec CoderObjectRecordSpec `json:"spec"`
}

// CoderObjectRecordList is a list of records.
//
// +kubebuilder:object:root=true
type CoderObjectRecordList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderObjectRecord `json:"items"`
}
