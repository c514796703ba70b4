// Package config holds coder-k8s's versioned configuration file: its types,
// its defaults (in one place, pinned by a golden file), the layered loader
// (defaults < file < environment < explicitly set flags) and validation that
// reports every problem with its field path.
package config

import (
	"encoding/json"
	"fmt"
	"time"
)

// The envelope every configuration file carries.
const (
	GroupName  = "config.coder.com"
	APIVersion = GroupName + "/v1alpha1"
	Kind       = "CoderK8sConfiguration"
)

// AppMode selects which components the process runs.
type AppMode string

// The application modes. AppAll runs every component on one shared manager.
const (
	AppAll                 AppMode = "all"
	AppController          AppMode = "controller"
	AppAggregatedAPIServer AppMode = "aggregated-apiserver"
	AppMCPHTTP             AppMode = "mcp-http"
)

// AppModes lists the valid modes in the order help texts show them.
var AppModes = []AppMode{AppAll, AppController, AppAggregatedAPIServer, AppMCPHTTP}

// Configuration is the whole coder-k8s configuration file
// (apiVersion config.coder.com/v1alpha1, kind CoderK8sConfiguration).
type Configuration struct {
	// APIVersion must be config.coder.com/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind must be CoderK8sConfiguration.
	Kind string `json:"kind"`

	// App selects the components to run: all, controller,
	// aggregated-apiserver or mcp-http.
	App AppMode `json:"app"`

	// Logging configures the process's logs.
	Logging Logging `json:"logging"`
	// Kubernetes configures the Kubernetes API client.
	Kubernetes Kubernetes `json:"kubernetes"`
	// Controller configures the reconcilers' manager.
	Controller Controller `json:"controller"`
	// AggregatedAPIServer configures the aggregation.coder.com API server.
	AggregatedAPIServer AggregatedAPIServer `json:"aggregatedAPIServer"`
	// MCP configures the Model Context Protocol server.
	MCP MCP `json:"mcp"`

	// Warnings says what in the loaded configuration still works but
	// should change (keys whose meaning changed); Load fills it, and the
	// process logs it at start. Never read from or written to a file.
	Warnings []string `json:"-"`
}

// Logging configures the zap logger shared by every component.
type Logging struct {
	// Level is debug, info, warn or error.
	Level string `json:"level"`
	// Format is json (for log collectors) or console (for people).
	Format string `json:"format"`
}

// Kubernetes configures the client every component uses to reach the
// Kubernetes API.
type Kubernetes struct {
	// Kubeconfig is a kubeconfig file path. Empty means $KUBECONFIG, then
	// the in-cluster service account.
	Kubeconfig string `json:"kubeconfig"`
	// QPS is the client's sustained request rate to the Kubernetes API.
	QPS float32 `json:"qps"`
	// Burst is the client's short-term request rate limit.
	Burst int `json:"burst"`
}

// Controller configures the controller-runtime manager.
type Controller struct {
	// HealthProbeBindAddress serves /healthz and /readyz.
	HealthProbeBindAddress string `json:"healthProbeBindAddress"`
	// MetricsBindAddress serves Prometheus metrics; "0" disables them.
	MetricsBindAddress string `json:"metricsBindAddress"`
	// CoderRequestTimeout bounds each call the reconcilers make to coderd,
	// so an unreachable coderd cannot stall other control planes.
	CoderRequestTimeout Duration `json:"coderRequestTimeout"`
	// OperatorAccessCheckInterval is how often each control plane's coderd
	// is asked whether it answers and still accepts the operator's token:
	// the longest a coderd outage or a revoked token goes unnoticed in the
	// CoderControlPlane's status.
	OperatorAccessCheckInterval Duration `json:"operatorAccessCheckInterval"`
	// ReplacedTokenRevocationDelay is how long an operator token keeps
	// working after the controller stored its replacement, before the
	// controller revokes it: long enough for the aggregated API server of
	// every replica to read the new token and for requests already sent
	// with the old one to finish, so that a rotation fails no request.
	ReplacedTokenRevocationDelay Duration `json:"replacedTokenRevocationDelay"`
	// LeaderElection makes one replica reconcile while every replica
	// serves the aggregated API and MCP.
	LeaderElection LeaderElection `json:"leaderElection"`
	// WorkspaceRBAC limits what a CoderControlPlane's spec.workspaceRBAC
	// may grant coderd's service account: which ClusterRoles the operator
	// binds and in which namespaces. The operator may bind only these
	// ClusterRoles (the chart grants bind on them by name).
	WorkspaceRBAC WorkspaceRBAC `json:"workspaceRBAC"`
}

// WorkspaceRBAC is the policy for spec.workspaceRBAC. The operator
// creates RoleBindings to ClusterRoles an administrator installed, never
// Roles with rules of the spec's choosing.
type WorkspaceRBAC struct {
	// ClusterRole is bound in each namespace of a control plane whose
	// spec.workspaceRBAC.clusterRoles is empty: what Kubernetes workspace
	// templates need (the chart installs <fullname>-workspace). Empty
	// means no default: such control planes get no workspace RBAC.
	ClusterRole string `json:"clusterRole"`
	// DeploymentsClusterRole is bound as well for
	// spec.workspaceRBAC.deployments (the chart installs
	// <fullname>-workspace-deployments). Empty refuses deployments: true.
	DeploymentsClusterRole string `json:"deploymentsClusterRole"`
	// AllowedClusterRoles are further ClusterRoles
	// spec.workspaceRBAC.clusterRoles may name.
	AllowedClusterRoles []string `json:"allowedClusterRoles"`
	// ExtraNamespaces says which namespaces besides their own the control
	// planes of a namespace may list in spec.workspaceRBAC.extraNamespaces.
	// Empty (the default): none, a control plane reaches only its own
	// namespace.
	ExtraNamespaces []WorkspaceNamespaces `json:"extraNamespaces"`
}

// WorkspaceNamespaces lets the control planes of one namespace reach
// other namespaces.
type WorkspaceNamespaces struct {
	// ControlPlaneNamespace is the namespace of the control planes.
	ControlPlaneNamespace string `json:"controlPlaneNamespace"`
	// Namespaces they may list in spec.workspaceRBAC.extraNamespaces.
	Namespaces []string `json:"namespaces"`
}

// LeaderElection configures the Lease that makes one replica reconcile.
type LeaderElection struct {
	// Enabled turns leader election on; turn it off only with one replica.
	Enabled bool `json:"enabled"`
	// LeaseName names the coordination.k8s.io Lease.
	LeaseName string `json:"leaseName"`
	// Namespace of the Lease. Empty means the pod's own namespace.
	Namespace string `json:"namespace"`
	// LeaseDuration is how long a lease is valid without renewal: the
	// longest a failover waits.
	LeaseDuration Duration `json:"leaseDuration"`
	// RenewDeadline is how long the leader keeps retrying to renew before
	// it gives up leadership.
	RenewDeadline Duration `json:"renewDeadline"`
	// RetryPeriod is the interval between attempts to acquire or renew.
	RetryPeriod Duration `json:"retryPeriod"`
}

// AggregatedAPIServer configures the aggregation.coder.com API server.
type AggregatedAPIServer struct {
	// BindAddress is the IP the secure port listens on.
	BindAddress string `json:"bindAddress"`
	// SecurePort is the HTTPS port kube-apiserver's aggregation layer
	// connects to.
	SecurePort int `json:"securePort"`
	// CertDir holds tls.crt and tls.key (a mounted kubernetes.io/tls
	// Secret, for example from cert-manager). Empty, or a directory without
	// them, means a self-signed certificate generated at start, unless
	// AutoTLS is enabled.
	CertDir string `json:"certDir"`
	// AutoTLS makes coder-k8s keep its own CA and serving certificate in a
	// Secret, rotate them, and put the CA into its APIService's caBundle.
	AutoTLS AutoTLS `json:"autoTLS"`
	// RequestTimeout bounds every request. No request waits for a
	// template build (they build in the background), so only watches
	// use a long one.
	RequestTimeout Duration `json:"requestTimeout"`
	// TemplateBuildWait tunes the background wait for template builds.
	TemplateBuildWait TemplateBuildWait `json:"templateBuildWait"`
	// WatchPollInterval is how often the shared poller lists from coderd
	// to turn changes made anywhere into watch events.
	WatchPollInterval Duration `json:"watchPollInterval"`
	// Coder configures the calls to coderd.
	Coder Coder `json:"coder"`
	// Identity configures, for every backend whose identity mode is
	// Mapped, the callers that are not mapped onto a Coder user.
	Identity AggregatedIdentity `json:"identity"`
	// Admission configures the admission chain run on writes.
	Admission AggregatedAdmission `json:"admission"`
}

// AggregatedAdmission configures the admission chain of the aggregated
// API server. kube-apiserver does not run admission on requests it proxies
// to an aggregated API server, so this server runs kube-apiserver's
// chain itself: NamespaceLifecycle, MutatingAdmissionPolicy (where the
// cluster serves it), MutatingAdmissionWebhook, ValidatingAdmissionPolicy
// and ValidatingAdmissionWebhook, fed by the cluster's own webhook
// configurations, policies and bindings.
type AggregatedAdmission struct {
	// Enabled runs the chain. Off, the cluster's admission policies and
	// webhooks never see a CoderWorkspace or CoderTemplate, and the
	// process watches no webhook configurations, admission policies or
	// bindings (in mode all it still watches namespaces, to find each
	// namespace's control planes).
	Enabled bool `json:"enabled"`
}

// AggregatedIdentity configures callers of the aggregated API that act
// with the operator's Coder session in identity mode Mapped.
type AggregatedIdentity struct {
	// ClusterControllers are exact Kubernetes usernames of the cluster's
	// own controllers, which list, watch and delete every resource type:
	// kube-controller-manager's garbage collector and namespace controller
	// (as their ServiceAccounts with --use-service-account-credentials,
	// else as system:kube-controller-manager). In identity mode Mapped they
	// act with the operator's Coder session instead of being refused for
	// having no Coder user: they read every object (restricted fields
	// redacted), delete objects, and change only Kubernetes metadata.
	// An empty list lists none.
	ClusterControllers []string `json:"clusterControllers"`
}

// AutoTLS configures the serving certificate coder-k8s manages itself: a
// CA and a certificate for the Service's DNS names, kept in one Secret
// that every replica shares, renewed before they expire, with the CA
// written into the APIService so kube-apiserver trusts the server.
type AutoTLS struct {
	// Enabled turns it on; certDir is then ignored.
	Enabled bool `json:"enabled"`
	// SecretName is the Secret holding the CA and the serving certificate.
	SecretName string `json:"secretName"`
	// Namespace of the Secret and the Service. Empty means the pod's own
	// namespace.
	Namespace string `json:"namespace"`
	// ServiceName is the Service kube-apiserver reaches the server through;
	// the certificate names <service>.<namespace>.svc.
	ServiceName string `json:"serviceName"`
	// APIServiceName is the APIService whose caBundle is kept current.
	APIServiceName string `json:"apiServiceName"`
	// CertValidity is how long a serving certificate is valid; it is
	// renewed when a third of that is left.
	CertValidity Duration `json:"certValidity"`
}

// TemplateBuildWait tunes the background wait for a template version
// that a CoderTemplate create or update uploaded: coder-k8s polls its
// build every InitialPollInterval until BackoffAfter, then doubles the
// interval up to MaxPollInterval, makes the version active once it has
// built, and gives up after Timeout. Requests do not wait for builds.
type TemplateBuildWait struct {
	// Timeout is how long a version may build before coder-k8s cancels
	// its import in Coder and shows the template Ready=False reason
	// BuildFailed. (Before background builds it bounded a request's wait
	// and could not exceed requestTimeout.)
	Timeout Duration `json:"timeout"`
	// BackoffAfter is how long to poll at InitialPollInterval before
	// doubling the interval.
	BackoffAfter Duration `json:"backoffAfter"`
	// InitialPollInterval is the first polling interval.
	InitialPollInterval Duration `json:"initialPollInterval"`
	// MaxPollInterval caps the doubled polling interval.
	MaxPollInterval Duration `json:"maxPollInterval"`
}

// Coder configures how the aggregated API server calls coderd.
type Coder struct {
	// RequestTimeout bounds each call to coderd.
	RequestTimeout Duration `json:"requestTimeout"`
	// StaticBackend is a coderd given here instead of discovered from
	// CoderControlPlane objects.
	StaticBackend StaticBackend `json:"staticBackend"`
}

// StaticBackend is one coderd given in the configuration rather than
// discovered from CoderControlPlane objects; standalone aggregated-apiserver
// mode requires it.
type StaticBackend struct {
	// URL of coderd, for example https://coder.example.com.
	URL string `json:"url"`
	// SessionTokenFile is the path of a file holding the session token
	// (mounted from a Secret). The token itself never goes in this file.
	SessionTokenFile string `json:"sessionTokenFile"`
	// Namespace is the Kubernetes namespace the backend's objects appear in.
	Namespace string `json:"namespace"`
	// Identity says whose Coder identity callers act with, as a
	// CoderControlPlane's spec.identity does. The session token must then
	// be an owner's, which mints tokens for the mapped users.
	Identity Identity `json:"identity"`

	// SessionToken comes only from the --coder-session-token flag; it is
	// never read from or written to a configuration file.
	SessionToken string `json:"-"`
}

// Identity maps Kubernetes users onto Coder users (see
// CoderControlPlane spec.identity).
type Identity struct {
	// Mode is Mapped (each caller acts as their own Coder user) or
	// Operator (every caller acts as the session token's user).
	Mode string `json:"mode"`
	// UsernamePrefix is removed from a Kubernetes username before it is
	// matched (for example "oidc:").
	UsernamePrefix string `json:"usernamePrefix"`
	// MatchBy is Email or Username: the Coder user field the username
	// must equal, ignoring case.
	MatchBy string `json:"matchBy"`
	// Mappings name the Coder user (username, or email with an @) of given
	// Kubernetes users; the only way to map system: users.
	Mappings []IdentityMapping `json:"mappings"`
}

// IdentityMapping maps one Kubernetes user onto one Coder user.
type IdentityMapping struct {
	KubernetesUser string `json:"kubernetesUser"`
	CoderUser      string `json:"coderUser"`
}

// Enabled reports whether a static backend is configured.
func (s StaticBackend) Enabled() bool { return s.URL != "" }

// MCP configures the Model Context Protocol server.
type MCP struct {
	// BindAddress serves /mcp, /healthz and /readyz.
	BindAddress string `json:"bindAddress"`
	// Auth is how agents authenticate: "kubernetes" (a bearer token checked
	// with a TokenReview; tools call kube-apiserver with that same token, so
	// the caller's RBAC, admission and audit apply) or "none" (no
	// authentication, tools act with the operator's own rights, which
	// include nothing only the tools need: local development only, logged
	// as a warning, and refused unless bindAddress is a loopback address:
	// 127.0.0.0/8, ::1 or localhost).
	Auth MCPAuth `json:"auth"`
	// Audiences, when set, are sent with every TokenReview: a token must be
	// valid for one of them. The tools forward the token to kube-apiserver,
	// so it must be valid for kube-apiserver's audience too. Empty means
	// kube-apiserver's own audiences.
	Audiences []string `json:"audiences"`
	// OAuth describes /mcp as an OAuth 2.0 protected resource (RFC 9728),
	// so MCP clients can sign in with the cluster's identity provider.
	OAuth MCPOAuth `json:"oauth"`
	// ReadOnly registers no tool that changes anything.
	ReadOnly bool `json:"readOnly"`
	// AllowDestructiveTools registers tools that delete (delete_workspace).
	AllowDestructiveTools bool `json:"allowDestructiveTools"`
	// AllowTools, when not empty, registers only the tools named here.
	AllowTools []string `json:"allowTools"`
	// DenyTools never registers the tools named here.
	DenyTools []string `json:"denyTools"`
	// MaxRequestBytes bounds the body of a request to /mcp.
	MaxRequestBytes int64 `json:"maxRequestBytes"`
	// ReadHeaderTimeout bounds how long a client may take to send request
	// headers.
	ReadHeaderTimeout Duration `json:"readHeaderTimeout"`
	// ToolTimeout bounds one tool call, including a bounded wait for a
	// workspace build.
	ToolTimeout Duration `json:"toolTimeout"`
}

// MCPOAuth is the protected resource metadata served at
// /.well-known/oauth-protected-resource (with auth "kubernetes").
type MCPOAuth struct {
	// Resource is the URL of the /mcp endpoint as clients reach it (https,
	// or http on a loopback host). Empty means the URL each request
	// reached, scheme from the connection (X-Forwarded-Proto is not
	// trusted): set it behind a TLS-terminating proxy.
	Resource string `json:"resource"`
	// AuthorizationServers are the issuer URLs (https) of the identity
	// providers whose tokens kube-apiserver accepts, such as the cluster's
	// OIDC issuer. Empty: the metadata names none and clients need a token
	// handed to them.
	AuthorizationServers []string `json:"authorizationServers"`
	// Scopes are the OAuth scopes clients should ask for (scopes_supported),
	// for example openid and the scope that puts groups in the token.
	Scopes []string `json:"scopes"`
}

// MCPAuth selects how MCP callers authenticate.
type MCPAuth string

// MCP authentication modes.
const (
	MCPAuthKubernetes MCPAuth = "kubernetes"
	MCPAuthNone       MCPAuth = "none"
)

// Duration is a time.Duration written as a Go duration string ("30s",
// "25m") in the configuration file.
type Duration struct {
	time.Duration
}

// D wraps a time.Duration.
func D(d time.Duration) Duration { return Duration{Duration: d} }

// MarshalJSON writes the duration as a string such as "25m0s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("expected a duration string such as \"30s\": %w", err)
	}
	return d.UnmarshalText([]byte(s))
}

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("expected a duration such as \"30s\" or \"25m\", got %q", string(b))
	}
	d.Duration = v
	return nil
}
