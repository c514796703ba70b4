package mcpserver

// What coder-k8s itself needs for the MCP server: checking callers'
// tokens. Nothing else: with mcp.auth kubernetes every tool calls
// kube-apiserver with the caller's own token, so the caller's RBAC decides
// (and kube-apiserver audits the caller); with mcp.auth none (loopback,
// local development) the tools have only the rights coder-k8s holds for
// its other components.
//
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
