package v1alpha1

// Condition types and reasons of the coder.com kinds. They are part of the
// API: tools (kubectl wait, kstatus, Argo CD health checks, alerts) match
// on them, so they live here rather than in the controllers.

// Condition types.
const (
	// ConditionAvailable: the workload serves requests.
	ConditionAvailable = "Available"
	// ConditionOperatorAccessReady: the operator holds a working Coder
	// token. Unknown (reason CoderdUnreachable) while coderd does not
	// answer: the last token stays in use until it does.
	ConditionOperatorAccessReady = "OperatorAccessReady"
	// ConditionControlPlaneReady: the referenced control plane is usable.
	ConditionControlPlaneReady = "ControlPlaneReady"
	// ConditionFeatureSupported: the coderd offers the feature this
	// object needs.
	ConditionFeatureSupported = "FeatureSupported"
	// ConditionCredentialsReady: the key or token this object runs with is
	// issued and stored in its Secret.
	ConditionCredentialsReady = "CredentialsReady"
	// ConditionLicenseApplied: the referenced license was uploaded.
	ConditionLicenseApplied = "LicenseApplied"
	// ConditionReconciled: the operator wrote every child of a deployed
	// control plane and every Secret the pods mount exists.
	ConditionReconciled = "Reconciled"
	// ConditionExposed: the Ingress or HTTPRoute of spec.expose is in
	// place. Present only when spec.expose is set.
	ConditionExposed = "Exposed"
	// ConditionInitialized: a deployed coderd has its first user. Until
	// then the operator creates no Service, Ingress or HTTPRoute for it
	// and reaches coderd at a ready pod only, so that nobody else can
	// claim coderd by creating its first user. Absent for an adopted
	// coderd (spec.externalURL).
	ConditionInitialized = "Initialized"
	// ConditionIdentityMapped: callers of the aggregated API and MCP act
	// in this coderd as their own Coder users (spec.identity.mode Mapped);
	// False, reason OperatorIdentity, when they all act as the operator.
	ConditionIdentityMapped = "IdentityMapped"
)

// Reasons every kind may report.
const (
	// ReasonReconciling: the condition has not been evaluated yet.
	ReasonReconciling = "Reconciling"
	// ReasonCoderdUnreachable: coderd did not answer (network error or
	// timeout).
	ReasonCoderdUnreachable = "CoderdUnreachable"
	// ReasonCoderAPIError: coderd answered with an error the operator did
	// not expect.
	ReasonCoderAPIError = "CoderAPIError"
	// ReasonNotSupported: the coderd is an open-source build without the
	// feature.
	ReasonNotSupported = "NotSupported"
	// ReasonNotEntitled: the coderd's license does not include the feature.
	ReasonNotEntitled = "NotEntitled"
)

// Reasons of a CoderControlPlane's conditions.
const (
	// IdentityMapped.
	ReasonMapped           = "Mapped"
	ReasonOperatorIdentity = "OperatorIdentity"

	// Reconciled.
	ReasonApplied        = "Applied"
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonApplyFailed: a child was refused in a way that needs a change
	// to the spec or to the cluster (invalid, forbidden, name taken,
	// namespace missing).
	ReasonApplyFailed = "ApplyFailed"
	// ReasonApplyError: a child could not be written for a reason that
	// may go away by itself (API errors, timeouts); it is retried.
	ReasonApplyError = "ApplyError"
	// ReasonWorkspaceRBACRefused: spec.workspaceRBAC asks for a ClusterRole,
	// a namespace or rules the operator's configuration does not allow;
	// no workspace RBAC is created until the spec or the configuration
	// changes.
	ReasonWorkspaceRBACRefused = "WorkspaceRBACRefused"

	// Exposed.
	ReasonIngressApplied         = "IngressApplied"
	ReasonHTTPRouteApplied       = "HTTPRouteApplied"
	ReasonGatewayAPINotInstalled = "GatewayAPINotInstalled"

	// Available.
	ReasonDeploymentAvailable   = "DeploymentAvailable"
	ReasonDeploymentUnavailable = "DeploymentUnavailable"
	ReasonCoderdReachable       = "CoderdReachable"
	ReasonReachabilityUnknown   = "ReachabilityUnknown"

	// OperatorAccessReady.
	ReasonTokenValid               = "TokenValid"
	ReasonDisabled                 = "Disabled"
	ReasonOwnerCredentialsRequired = "OwnerCredentialsRequired"
	ReasonOwnerSecretMissing       = "OwnerSecretMissing"
	ReasonOwnerCredentialsRejected = "OwnerCredentialsRejected"
	// ReasonCredentialsURLMismatch: the owner token or credentials the
	// operator would need were issued for another coderd URL than the
	// control plane's (spec.externalURL or the Service URL changed); the
	// operator sent nothing to the new URL and needs credentials issued
	// for it.
	ReasonCredentialsURLMismatch = "CredentialsURLMismatch"
	// ReasonAccessError: the access manager failed in a way it did not
	// classify itself.
	ReasonAccessError = "AccessReconcileFailed"

	// Initialized.
	ReasonFirstUserExists = "FirstUserExists"
	// ReasonAwaitingFirstUser: no first user yet; the Service, Ingress and
	// HTTPRoute wait for it.
	ReasonAwaitingFirstUser = "AwaitingFirstUser"

	// LicenseApplied.
	ReasonLicenseUploaded      = "Uploaded"
	ReasonLicenseNotApplied    = "NotApplied"
	ReasonLicenseRejected      = "Rejected"
	ReasonLicenseSecretMissing = "LicenseSecretMissing"
	// ReasonWaitingForAccess: the license is uploaded once operator
	// access works.
	ReasonWaitingForAccess = "WaitingForOperatorAccess"
)

// Reasons of the kinds that depend on a control plane (CoderProvisioner,
// CoderWorkspaceProxy).
const (
	// ControlPlaneReady.
	ReasonReady                  = "Ready"
	ReasonControlPlaneNotFound   = "ControlPlaneNotFound"
	ReasonOperatorAccessNotReady = "OperatorAccessNotReady"

	// FeatureSupported.
	ReasonSupported = "Supported"

	// CredentialsReady.
	ReasonKeyReady             = "KeyReady"
	ReasonOrganizationNotFound = "OrganizationNotFound"
	ReasonRegistered           = "Registered"
	ReasonTokenSupplied        = "TokenSupplied"
	ReasonTokenSecretNotFound  = "TokenSecretNotFound"
	ReasonNameConflict         = "NameConflict"
	ReasonSecretConflict       = "SecretConflict"

	// Available.
	ReasonDeploymentConflict = "DeploymentConflict"
	ReasonServiceConflict    = "ServiceConflict"
	ReasonReplicasReady      = "ReplicasReady"
	ReasonReplicasNotReady   = "ReplicasNotReady"
	ReasonScaledToZero       = "ScaledToZero"
)

// Labels of what coder-k8s creates. LabelControlPlane and
// LabelControlPlaneNamespace find a control plane's objects again, also
// in namespaces where an owner reference cannot point to it.
const (
	LabelManagedBy             = "app.kubernetes.io/managed-by"
	ManagedByValue             = "coder-k8s"
	LabelControlPlane          = "coder.com/control-plane"
	LabelControlPlaneNamespace = "coder.com/control-plane-namespace"
)
