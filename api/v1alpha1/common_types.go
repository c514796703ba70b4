package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
)

// DefaultImage is the Coder image workloads run when spec.image is empty:
// the release this operator is built and tested against.
const DefaultImage = "ghcr.io/coder/coder:v2.30.0"

// Phase summarizes an object's state for `kubectl get`; conditions carry
// the detail.
// +kubebuilder:validation:Enum=Pending;Provisioning;Ready;Degraded;Failed;Unsupported
type Phase string

// Phases shared by the coder.com kinds.
const (
	// PhasePending: waiting for something the object references.
	PhasePending Phase = "Pending"
	// PhaseProvisioning: children created, not all available yet.
	PhaseProvisioning Phase = "Provisioning"
	// PhaseReady: everything is available.
	PhaseReady Phase = "Ready"
	// PhaseDegraded: was ready, something is no longer available.
	PhaseDegraded Phase = "Degraded"
	// PhaseFailed: cannot make progress without a change to the spec or
	// to a referenced object.
	PhaseFailed Phase = "Failed"
	// PhaseUnsupported: the coderd lacks the feature (open-source build or
	// not entitled).
	PhaseUnsupported Phase = "Unsupported"
)

// ControlPlaneReference names a CoderControlPlane in the same namespace.
type ControlPlaneReference struct {
	// Name of the CoderControlPlane.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// SecretKeyReference selects a key of a Secret in the same namespace.
type SecretKeyReference struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the Secret.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// ServiceSpec shapes a Service in front of a workload.
type ServiceSpec struct {
	// Type of the Service.
	// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer
	// +kubebuilder:default=ClusterIP
	// +optional
	Type corev1.ServiceType `json:"type,omitempty"`
	// Port the Service exposes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +kubebuilder:default=80
	// +optional
	Port int32 `json:"port,omitempty"`
	// Annotations of the Service, for example for a cloud load balancer.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// LoadBalancerIP requests an address for a LoadBalancer Service.
	// +optional
	LoadBalancerIP string `json:"loadBalancerIP,omitempty"`
	// ExternalTrafficPolicy of a NodePort or LoadBalancer Service.
	// +kubebuilder:validation:Enum=Cluster;Local
	// +optional
	ExternalTrafficPolicy corev1.ServiceExternalTrafficPolicy `json:"externalTrafficPolicy,omitempty"`
}

// PodSpec holds the pod-level settings every coder.com workload shares.
type PodSpec struct {
	// Image of the container. Defaults to the Coder release this operator
	// is built and tested against.
	// +optional
	Image string `json:"image,omitempty"`
	// ImagePullPolicy of the container.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// ImagePullSecrets for private registries.
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// Replicas of the Deployment.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Env adds environment variables to the container; they win over the
	// ones the operator sets.
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// EnvFrom adds environment variables from ConfigMaps and Secrets.
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`
	// ExtraArgs are appended to the container's arguments.
	// +optional
	ExtraArgs []string `json:"extraArgs,omitempty"`
	// Resources of the container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// PodSecurityContext replaces the restricted default (non-root, seccomp
	// RuntimeDefault).
	// +optional
	PodSecurityContext *corev1.PodSecurityContext `json:"podSecurityContext,omitempty"`
	// SecurityContext replaces the container's restricted default (no
	// privilege escalation, all capabilities dropped, read-only root).
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`
	// Volumes added to the pod.
	// +optional
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// VolumeMounts added to the container.
	// +optional
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// NodeSelector of the pod.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Tolerations of the pod.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Affinity of the pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// TopologySpreadConstraints of the pod.
	// +optional
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// PodAnnotations are added to the pod template.
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`
	// PodLabels are added to the pod template.
	// +optional
	PodLabels map[string]string `json:"podLabels,omitempty"`
	// PriorityClassName of the pod.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
}
