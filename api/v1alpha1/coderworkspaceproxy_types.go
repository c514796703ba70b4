package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderWorkspaceProxySpec describes a workspace proxy (`coder wsproxy
// server`) registered with a control plane.
type CoderWorkspaceProxySpec struct {
	// ControlPlaneRef is the CoderControlPlane the proxy registers with.
	ControlPlaneRef ControlPlaneReference `json:"controlPlaneRef"`
	// DisplayName shown to users choosing a region.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// Icon URL or path shown with the region.
	// +optional
	Icon string `json:"icon,omitempty"`
	// AccessURL is where users reach the proxy.
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	AccessURL string `json:"accessURL"`
	// WildcardAccessURL serves workspace applications through the proxy.
	// +optional
	WildcardAccessURL string `json:"wildcardAccessURL,omitempty"`
	// ProxyTokenSecretRef supplies the proxy's token; without it the
	// operator registers the proxy through the Coder API and keeps the
	// token in a Secret it owns.
	// +optional
	ProxyTokenSecretRef *SecretKeyReference `json:"proxyTokenSecretRef,omitempty"`
	// Service in front of the proxy.
	// +kubebuilder:default={}
	// +optional
	Service ServiceSpec `json:"service,omitempty"`

	PodSpec `json:",inline"`
}

// CoderWorkspaceProxyStatus is what the operator observed.
type CoderWorkspaceProxyStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarizes the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// URL is the proxy's access URL as registered in Coder.
	// +optional
	URL string `json:"url,omitempty"`
	// Replicas and ReadyReplicas of the proxy's Deployment.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// ProxyID is the proxy's ID in Coder.
	// +optional
	ProxyID string `json:"proxyID,omitempty"`
	// TokenSecretRef selects the token the proxy runs with.
	// +optional
	TokenSecretRef *SecretKeyReference `json:"tokenSecretRef,omitempty"`
	// Conditions: ControlPlaneReady, FeatureSupported, CredentialsReady,
	// Available.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CoderWorkspaceProxy runs a workspace proxy for a control plane.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cwp,categories=coder
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Control Plane",type=string,JSONPath=`.spec.controlPlaneRef.name`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.url`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CoderWorkspaceProxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CoderWorkspaceProxySpec   `json:"spec,omitempty"`
	Status CoderWorkspaceProxyStatus `json:"status,omitempty"`
}

// CoderWorkspaceProxyList is a list of CoderWorkspaceProxies.
//
// +kubebuilder:object:root=true
type CoderWorkspaceProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderWorkspaceProxy `json:"items"`
}
