package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderControlPlaneSpec describes a coderd: one the operator deploys, or an
// existing one it adopts (externalURL) to hold operator access to it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.externalURL) || (!has(self.image) && !has(self.expose) && !has(self.tls))",message="externalURL adopts an existing coderd that the operator does not deploy: image, expose and tls cannot be set with it"
type CoderControlPlaneSpec struct {
	// ExternalURL adopts a coderd installed by other means: the operator
	// deploys nothing and only manages access to it.
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	// +optional
	ExternalURL string `json:"externalURL,omitempty"`

	PodSpec `json:",inline"`

	// AccessURL is the URL users and workspaces reach coderd at
	// (CODER_ACCESS_URL). Defaults to the in-cluster Service URL.
	// +kubebuilder:validation:Pattern=`^https?://[^\s/]+(/.*)?$`
	// +optional
	AccessURL string `json:"accessURL,omitempty"`
	// WildcardAccessURL serves workspace applications on subdomains
	// (CODER_WILDCARD_ACCESS_URL), for example *.coder.example.com.
	// +optional
	WildcardAccessURL string `json:"wildcardAccessURL,omitempty"`

	// Service in front of coderd.
	// +kubebuilder:default={}
	// +optional
	Service ServiceSpec `json:"service,omitempty"`
	// ServiceAccount coderd runs as.
	// +kubebuilder:default={}
	// +optional
	ServiceAccount ServiceAccountSpec `json:"serviceAccount,omitempty"`
	// WorkspaceRBAC grants coderd's service account what Kubernetes
	// templates need to run workspaces.
	// +kubebuilder:default={}
	// +optional
	WorkspaceRBAC WorkspaceRBACSpec `json:"workspaceRBAC,omitempty"`
	// TLS serves coderd over HTTPS with certificates from Secrets.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
	// CACerts are extra CA certificates coderd trusts (for example for an
	// internal OIDC provider), mounted from Secrets.
	// +optional
	CACerts []SecretKeyReference `json:"caCerts,omitempty"`
	// LivenessProbe replaces the default probe (GET /healthz).
	// +optional
	LivenessProbe *corev1.Probe `json:"livenessProbe,omitempty"`
	// ReadinessProbe replaces the default probe (GET /healthz).
	// +optional
	ReadinessProbe *corev1.Probe `json:"readinessProbe,omitempty"`
	// Expose makes coderd reachable from outside the cluster.
	// +optional
	Expose *ExposeSpec `json:"expose,omitempty"`
	// OperatorAccess controls the Coder user and token the operator holds
	// for the aggregated API server and MCP.
	// +kubebuilder:default={}
	// +optional
	OperatorAccess OperatorAccessSpec `json:"operatorAccess,omitempty"`
	// Identity says whose Coder identity the aggregated API and MCP act
	// with: each caller's own (Mapped, the default) or the operator's.
	// +kubebuilder:default={}
	// +optional
	Identity IdentitySpec `json:"identity,omitempty"`
	// License uploads a Coder license from a Secret.
	// +optional
	License *LicenseSpec `json:"license,omitempty"`
}

// IdentitySpec maps Kubernetes users onto Coder users. In Mapped mode a
// request to coderworkspaces or codertemplates is made in Coder as the
// caller's Coder user, with a short-lived token the operator mints for
// that user, so Coder decides what the caller may read and do and Coder's
// audit log names them; a caller with no Coder user is refused (403).
type IdentitySpec struct {
	// Mode is Mapped (each caller acts as their Coder user) or Operator
	// (every caller acts as the operator's own owner user: whoever may use
	// the resources in this namespace may do anything an owner may).
	// +kubebuilder:validation:Enum=Mapped;Operator
	// +kubebuilder:default=Mapped
	// +optional
	Mode string `json:"mode,omitempty"`
	// UsernamePrefix is removed from a Kubernetes username before it is
	// matched (for example "oidc:", kube-apiserver's OIDC username
	// prefix). A username without it is matched as it is.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	UsernamePrefix string `json:"usernamePrefix,omitempty"`
	// MatchBy is the Coder user field the rest of the username must equal,
	// ignoring case: Email or Username. Only active (or dormant) users
	// match; a suspended user is refused.
	// +kubebuilder:validation:Enum=Email;Username
	// +kubebuilder:default=Email
	// +optional
	MatchBy string `json:"matchBy,omitempty"`
	// Mappings name the Coder user of given Kubernetes users, before the
	// rule above applies. They are the only way to map system: users,
	// such as ServiceAccounts.
	// +listType=map
	// +listMapKey=kubernetesUser
	// +kubebuilder:validation:MaxItems=1000
	// +optional
	Mappings []IdentityMapping `json:"mappings,omitempty"`
}

// IdentityMapping maps one Kubernetes user onto one Coder user.
type IdentityMapping struct {
	// KubernetesUser is the username as kube-apiserver authenticates it,
	// for example system:serviceaccount:argocd:argocd-application-controller.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	KubernetesUser string `json:"kubernetesUser"`
	// CoderUser is a Coder username, or an email address (with an @).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=320
	CoderUser string `json:"coderUser"`
}

// ServiceAccountSpec configures the service account coderd runs as.
type ServiceAccountSpec struct {
	// Create makes the operator create and own the service account; false
	// uses an existing one named Name.
	// +kubebuilder:default=true
	// +optional
	Create *bool `json:"create,omitempty"`
	// Name of the service account. Defaults to the control plane's name.
	// +optional
	Name string `json:"name,omitempty"`
	// Annotations of a created service account (for example a cloud IAM
	// role binding).
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// WorkspaceRBACSpec grants coderd's service account the access Kubernetes
// workspace templates need, in its namespace and extra namespaces, by
// binding ClusterRoles an administrator installed (RoleBindings only: the
// operator creates no Roles). Which ClusterRoles and namespaces are
// allowed is the operator's configuration (controller.workspaceRBAC); a
// spec asking for more is refused in the Reconciled condition.
type WorkspaceRBACSpec struct {
	// Enabled creates the RoleBindings.
	// +kubebuilder:default=true
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Deployments also binds the operator's ClusterRole for
	// apps/deployments (controller.workspaceRBAC.deploymentsClusterRole).
	// +optional
	Deployments bool `json:"deployments,omitempty"`
	// ClusterRoles are bound instead of the operator's default workspace
	// ClusterRole (controller.workspaceRBAC.clusterRole); each must be one
	// the operator's configuration allows.
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MinLength=1
	// +listType=set
	// +optional
	ClusterRoles []string `json:"clusterRoles,omitempty"`
	// ExtraRules is refused when not empty: the operator no longer creates
	// Roles with rules chosen in the spec (which let anyone who may write
	// a control plane grant anything). Bind an administrator-installed
	// ClusterRole with ClusterRoles instead. Kept so that stored objects
	// still decode.
	// +optional
	ExtraRules []rbacv1.PolicyRule `json:"extraRules,omitempty"`
	// ExtraNamespaces also get the RoleBindings, for workspaces that run
	// outside the control plane's namespace. Only namespaces the operator's
	// configuration allows for the control plane's namespace
	// (controller.workspaceRBAC.extraNamespaces) are accepted.
	// +listType=set
	// +optional
	ExtraNamespaces []string `json:"extraNamespaces,omitempty"`
}

// TLSSpec serves coderd over HTTPS.
type TLSSpec struct {
	// SecretNames are kubernetes.io/tls Secrets whose certificates coderd
	// serves.
	// +kubebuilder:validation:MinItems=1
	SecretNames []string `json:"secretNames"`
}

// ExposeSpec makes coderd reachable through an Ingress or a Gateway API
// HTTPRoute.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.ingress) && has(self.httpRoute))",message="expose takes either ingress or httpRoute, not both"
type ExposeSpec struct {
	// Ingress creates a networking.k8s.io Ingress.
	// +optional
	Ingress *IngressSpec `json:"ingress,omitempty"`
	// HTTPRoute creates a gateway.networking.k8s.io HTTPRoute.
	// +optional
	HTTPRoute *HTTPRouteSpec `json:"httpRoute,omitempty"`
}

// IngressSpec configures the Ingress for coderd.
type IngressSpec struct {
	// ClassName is the IngressClass.
	// +optional
	ClassName string `json:"className,omitempty"`
	// Host is coderd's host name.
	// +kubebuilder:validation:MinLength=1
	Host string `json:"host"`
	// WildcardHost serves workspace applications, for example
	// *.coder.example.com.
	// +optional
	WildcardHost string `json:"wildcardHost,omitempty"`
	// Annotations of the Ingress.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
	// TLSSecretName terminates TLS at the Ingress.
	// +optional
	TLSSecretName string `json:"tlsSecretName,omitempty"`
}

// HTTPRouteSpec configures the HTTPRoute for coderd.
type HTTPRouteSpec struct {
	// ParentRefs are the Gateways the route attaches to.
	// +kubebuilder:validation:MinItems=1
	ParentRefs []GatewayReference `json:"parentRefs"`
	// Hostnames the route matches.
	// +optional
	Hostnames []string `json:"hostnames,omitempty"`
	// Annotations of the HTTPRoute.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// GatewayReference names a Gateway listener.
type GatewayReference struct {
	// Name of the Gateway.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Namespace of the Gateway; defaults to the route's.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// SectionName selects a listener of the Gateway.
	// +optional
	SectionName string `json:"sectionName,omitempty"`
}

// OperatorAccessSpec controls how the operator gets and keeps its access
// to coderd. On a fresh coderd the operator creates the first user itself;
// on one that has users it needs an owner token or owner credentials.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.ownerTokenSecretRef) && has(self.ownerCredentialsSecretRef))",message="give either ownerTokenSecretRef or ownerCredentialsSecretRef, not both"
type OperatorAccessSpec struct {
	// Disabled revokes the operator's token and deletes its Secret; the
	// control plane then is invisible to the aggregated API and MCP.
	// +optional
	Disabled bool `json:"disabled,omitempty"`
	// OwnerTokenSecretRef is an owner's session token for a coderd that
	// already has users.
	// +optional
	OwnerTokenSecretRef *SecretKeyReference `json:"ownerTokenSecretRef,omitempty"`
	// OwnerCredentialsSecretRef names a Secret with keys email and
	// password of an owner, for a coderd that already has users.
	// +optional
	OwnerCredentialsSecretRef *corev1.LocalObjectReference `json:"ownerCredentialsSecretRef,omitempty"`
	// TokenLifetime of the operator's token, capped at coderd's maximum
	// token lifetime; the token is rotated when a third of it is left.
	// +kubebuilder:default="168h"
	// +optional
	TokenLifetime *metav1.Duration `json:"tokenLifetime,omitempty"`
}

// LicenseSpec uploads a Coder license.
type LicenseSpec struct {
	// SecretRef selects the license JWT.
	SecretRef SecretKeyReference `json:"secretRef"`
}

// CoderControlPlaneStatus is what the operator observed.
type CoderControlPlaneStatus struct {
	// ObservedGeneration is the generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarizes the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// URL is where the operator reaches coderd.
	// +optional
	URL string `json:"url,omitempty"`
	// Replicas and ReadyReplicas of coderd's Deployment.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// CoderVersion is the version coderd reports.
	// +optional
	CoderVersion string `json:"coderVersion,omitempty"`
	// OperatorUser is the Coder user the operator acts as.
	// +optional
	OperatorUser string `json:"operatorUser,omitempty"`
	// OperatorTokenSecretRef selects the operator's Coder token.
	// +optional
	OperatorTokenSecretRef *SecretKeyReference `json:"operatorTokenSecretRef,omitempty"`
	// AdminCredentialsSecretRef names the Secret with the first user's
	// email and password, when the operator created that user.
	// +optional
	AdminCredentialsSecretRef *corev1.LocalObjectReference `json:"adminCredentialsSecretRef,omitempty"`
	// Entitlements coderd reports, when it has a license.
	// +optional
	Entitlements *EntitlementsStatus `json:"entitlements,omitempty"`
	// Conditions: Available, OperatorAccessReady, Reconciled, Exposed,
	// LicenseApplied.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// EntitlementsStatus summarizes coderd's license entitlements.
type EntitlementsStatus struct {
	// HasLicense reports whether a license is installed.
	HasLicense bool `json:"hasLicense"`
	// Trial reports a trial license.
	// +optional
	Trial bool `json:"trial,omitempty"`
	// Features that are entitled and enabled.
	// +listType=set
	// +optional
	Features []string `json:"features,omitempty"`
}

// CoderControlPlane runs or adopts a coderd and holds the operator's access
// to it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ccp,categories=coder
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label (at most 63 lowercase letters, digits and '-', starting with a letter): it names coderd's Service"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.url`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Access",type=string,JSONPath=`.status.conditions[?(@.type=="OperatorAccessReady")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CoderControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   CoderControlPlaneSpec   `json:"spec,omitempty"`
	Status CoderControlPlaneStatus `json:"status,omitempty"`
}

// CoderControlPlaneList is a list of CoderControlPlanes.
//
// +kubebuilder:object:root=true
type CoderControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderControlPlane `json:"items"`
}
