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

	// VersionName names the version spec.files builds (a release, a
	// commit SHA): letters, digits and single _ . or -, up to 64
	// characters. With new files, variables or tags the new version takes
	// it; a name another version of the template has is refused (409).
	// Changed alone, the template's version of that name is made active,
	// or, when it has none, the version shown is renamed. Unset, Coder
	// names new versions (status.activeVersionName shows the name). Read
	// back only when it was given.
	// +optional
	VersionName string `json:"versionName,omitempty"`
	// VersionMessage is the message of the version spec.files builds (a
	// commit subject). With a new version it is that version's message;
	// changed alone it changes the shown version's message in Coder.
	// Read back only when it was given.
	// +optional
	VersionMessage string `json:"versionMessage,omitempty"`
	// ProvisionerTags select the provisioner daemons that import the
	// version spec.files builds and build its workspaces (those of a
	// CoderProvisioner with the same tags). Changing them builds a new
	// version of the same files. coderd adds owner and scope
	// (organization unless scope: user is given); an import no daemon
	// matches waits, and the Ready condition says so.
	// +optional
	ProvisionerTags map[string]string `json:"provisionerTags,omitempty"`

	// The template's settings in Coder. Each is optional: unset keeps the
	// value Coder has (on create, Coder's default), and a read shows
	// Coder's current value, so a change made in the Coder UI shows as a
	// difference. Durations are written in Go's syntax ("8h", "90m") and
	// read back as written while Coder keeps that value.

	// DefaultTTL is how long a workspace runs before it stops on its own
	// (coderd's default_ttl_ms); 0 never stops it.
	// +optional
	DefaultTTL *Duration `json:"defaultTTL,omitempty"`
	// ActivityBump is how far connecting to a workspace pushes its stop
	// time out (activity_bump_ms); 0 does not.
	// +optional
	ActivityBump *Duration `json:"activityBump,omitempty"`
	// AllowUserCancelWorkspaceJobs lets users cancel their workspaces'
	// builds.
	// +optional
	AllowUserCancelWorkspaceJobs *bool `json:"allowUserCancelWorkspaceJobs,omitempty"`
	// CORSBehavior is how workspace apps answer cross-origin requests:
	// simple (coderd handles CORS) or passthru (the app does). Empty keeps
	// Coder's value.
	// +optional
	CORSBehavior CORSBehavior `json:"corsBehavior,omitempty"`
	// UseClassicParameterFlow makes workspaces of this template use the
	// classic parameter form instead of dynamic parameters.
	// +optional
	UseClassicParameterFlow *bool `json:"useClassicParameterFlow,omitempty"`

	// The settings below need a Coder license with the feature named on
	// each; a coderd without it refuses a change (422).

	// AutostopRequirement says on which days and every how many weeks
	// workspaces must stop (in their owners' quiet hours). Feature
	// advanced_template_scheduling.
	// +optional
	AutostopRequirement *AutostopRequirement `json:"autostopRequirement,omitempty"`
	// AutostartRequirement says on which days workspaces may start on
	// their own. Feature advanced_template_scheduling.
	// +optional
	AutostartRequirement *AutostartRequirement `json:"autostartRequirement,omitempty"`
	// AllowUserAutostart lets users give their workspaces an autostart
	// schedule. Feature advanced_template_scheduling.
	// +optional
	AllowUserAutostart *bool `json:"allowUserAutostart,omitempty"`
	// AllowUserAutostop lets users set their workspaces' TTL. Feature
	// advanced_template_scheduling.
	// +optional
	AllowUserAutostop *bool `json:"allowUserAutostop,omitempty"`
	// FailureTTL is how long after a failed build a workspace is stopped;
	// 0 or at least 1m. Feature advanced_template_scheduling.
	// +optional
	FailureTTL *Duration `json:"failureTTL,omitempty"`
	// TimeTilDormant is how long an unused workspace stays active before
	// it becomes dormant; 0 or at least 1m. Feature
	// advanced_template_scheduling.
	// +optional
	TimeTilDormant *Duration `json:"timeTilDormant,omitempty"`
	// TimeTilDormantAutoDelete is how long a dormant workspace is kept
	// before it is deleted; 0 or at least 1m. Feature
	// advanced_template_scheduling.
	// +optional
	TimeTilDormantAutoDelete *Duration `json:"timeTilDormantAutoDelete,omitempty"`
	// RequireActiveVersion makes workspaces build with the active version
	// only. Feature access_control.
	// +optional
	RequireActiveVersion *bool `json:"requireActiveVersion,omitempty"`
	// DeprecationMessage deprecates the template (no new workspaces) with
	// this message; "" makes it not deprecated, which needs no license.
	// Feature access_control.
	// +optional
	DeprecationMessage *string `json:"deprecationMessage,omitempty"`
	// MaxPortShareLevel is the widest level at which workspace ports may
	// be shared: owner, authenticated, organization or public. Empty keeps
	// Coder's value. Feature control_shared_ports (without it coderd
	// shows and allows only public).
	// +optional
	MaxPortShareLevel PortShareLevel `json:"maxPortShareLevel,omitempty"`
	// Access is who may use and administer the template: the whole list,
	// so that Coder's access list becomes exactly what it says (entries
	// it leaves out are removed in Coder). Unset keeps Coder's list, which
	// a read shows when coderd can tell (it has template_rbac). Feature
	// template_rbac; without it only Coder's default, everyone: use and
	// nothing else, is accepted.
	// +optional
	Access *TemplateAccess `json:"access,omitempty"`
}

// TemplateAccess is a template's access list in Coder. It is atomic for
// server-side apply (the whole list belongs to the manager that applies
// it): with per-entry merging an entry added in Coder, owned by no field
// manager, would survive every apply, and the list would not be what the
// manifest says.
// +structType=atomic
type TemplateAccess struct {
	// Everyone is the role of the organization's Everyone group (every
	// member of the template's organization): use or admin; empty or
	// absent gives its members no access through it. Coder gives a new
	// template use.
	// +optional
	Everyone TemplateRole `json:"everyone,omitempty"`
	// Users are Coder users, by username (each once), and their roles.
	// +optional
	// +listType=atomic
	Users []TemplateAccessEntry `json:"users,omitempty"`
	// Groups are groups of the template's organization, by name (each
	// once), and their roles. The Everyone group is
	// spec.access.everyone.
	// +optional
	// +listType=atomic
	Groups []TemplateAccessEntry `json:"groups,omitempty"`
}

// TemplateAccessEntry gives a user or a group a role on the template.
type TemplateAccessEntry struct {
	// Name is the Coder username, or the group's name.
	Name string `json:"name"`
	// Role is use (create workspaces from the template) or admin (also
	// change and delete it).
	Role TemplateRole `json:"role"`
}

// TemplateRole is a role on a template, as Coder names it.
// +enum
type TemplateRole string

// The template roles coderd knows.
const (
	TemplateRoleUse   TemplateRole = "use"
	TemplateRoleAdmin TemplateRole = "admin"
)

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

// Duration is a length of time in Go's syntax ("8h", "1h30m", "0s"),
// whole milliseconds, not negative. Unlike metav1.Duration it is kept as
// written, so that an object reads back as it was applied.
type Duration string

// AutostopRequirement is Coder's template autostop requirement.
type AutostopRequirement struct {
	// DaysOfWeek are the days workspaces must stop, in week order
	// (monday to sunday), each once; none means never.
	// +optional
	// +listType=atomic
	DaysOfWeek []string `json:"daysOfWeek,omitempty"`
	// Weeks is every how many weeks the days apply: 1 (every week) to 16.
	Weeks int64 `json:"weeks"`
}

// AutostartRequirement is Coder's template autostart requirement.
type AutostartRequirement struct {
	// DaysOfWeek are the days workspaces may start on their own, in week
	// order (monday to sunday), each once; none means no day.
	// +optional
	// +listType=atomic
	DaysOfWeek []string `json:"daysOfWeek,omitempty"`
}

// CORSBehavior is how workspace apps answer cross-origin requests.
// +enum
type CORSBehavior string

// The CORS behaviours coderd knows.
const (
	CORSBehaviorSimple   CORSBehavior = "simple"
	CORSBehaviorPassthru CORSBehavior = "passthru"
)

// PortShareLevel is a level at which workspace ports are shared.
// +enum
type PortShareLevel string

// The port share levels coderd knows, narrowest first.
const (
	PortShareLevelOwner         PortShareLevel = "owner"
	PortShareLevelAuthenticated PortShareLevel = "authenticated"
	PortShareLevelOrganization  PortShareLevel = "organization"
	PortShareLevelPublic        PortShareLevel = "public"
)

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
