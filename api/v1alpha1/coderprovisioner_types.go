package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderProvisionerSpec describes external provisioner daemons for a
// control plane (`coder provisioner start` with a provisioner key).
type CoderProvisionerSpec struct {
	// ControlPlaneRef is the CoderControlPlane the daemons serve.
	ControlPlaneRef ControlPlaneReference `json:"controlPlaneRef"`
	// Organization the daemons serve, by name.
	// +kubebuilder:default=coder
	// +kubebuilder:validation:MinLength=1
	// +optional
	Organization string `json:"organization,omitempty"`
	// Tags route template jobs to these daemons; changing them rotates
	// the provisioner key.
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	Tags map[string]string `json:"tags,omitempty"`

	PodSpec `json:",inline"`
}

// CoderProvisionerStatus is what the operator observed.
type CoderProvisionerStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarizes the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// Replicas and ReadyReplicas of the daemons' Deployment.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// KeyName is the provisioner key's name in Coder.
	// +optional
	KeyName string `json:"keyName,omitempty"`
	// KeySecretRef selects the provisioner key.
	// +optional
	KeySecretRef *SecretKeyReference `json:"keySecretRef,omitempty"`
	// OrganizationID is the Coder organization's ID.
	// +optional
	OrganizationID string `json:"organizationID,omitempty"`
	// Conditions: ControlPlaneReady, FeatureSupported, CredentialsReady,
	// Available.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CoderProvisioner runs external provisioner daemons for a control plane.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cprov,categories=coder
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Control Plane",type=string,JSONPath=`.spec.controlPlaneRef.name`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CoderProvisioner struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CoderProvisionerSpec   `json:"spec,omitempty"`
	Status CoderProvisionerStatus `json:"status,omitempty"`
}

// CoderProvisionerList is a list of CoderProvisioners.
//
// +kubebuilder:object:root=true
type CoderProvisionerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderProvisioner `json:"items"`
}
