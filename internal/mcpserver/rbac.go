package mcpserver

// What the MCP tools read and change as coder-k8s, after the caller's own
// RBAC has allowed the call (SubjectAccessReview), and what checking
// callers takes.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=pods;events,verbs=get;list
// +kubebuilder:rbac:groups="",resources=pods/log,verbs=get
//
// The control-plane tools read CoderControlPlanes, their Deployments and
// Services and check namespaces; in mode all through the controller's
// cache (the controller's rules cover its watches), in mode mcp-http
// directly, with these.
//
// +kubebuilder:rbac:groups=coder.com,resources=codercontrolplanes,verbs=get;list
// +kubebuilder:rbac:groups="",resources=namespaces;services,verbs=get
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get
//
// The aggregated resources are read uncached (no watch); set_workspace_running
// sends a patch and delete_workspace a delete, nothing updates.
//
// +kubebuilder:rbac:groups=aggregation.coder.com,resources=coderworkspaces,verbs=get;list;patch;delete
// +kubebuilder:rbac:groups=aggregation.coder.com,resources=codertemplates,verbs=get;list
