package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderWorkspace is a Coder workspace seen through Kubernetes. Its name is
// <organization>.<owner>.<workspace>, or
// <control plane>.<organization>.<owner>.<workspace> when the namespace has
// more than one control plane; coderd stores it.
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderWorkspace struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired workspace.
	Spec CoderWorkspaceSpec `json:"spec,omitempty"`
	// Status is the workspace as coderd reports it.
	// +optional
	Status CoderWorkspaceStatus `json:"status,omitempty"`
}

// CoderWorkspaceSpec is what a user sets on a workspace.
type CoderWorkspaceSpec struct {
	// Organization is the Coder organization name. It is part of the
	// object name; when set it must agree with it.
	// +optional
	Organization string `json:"organization,omitempty"`
	// TemplateName is the template the workspace is built from, in the same
	// organization. Required on create; a workspace cannot move to another
	// template.
	TemplateName string `json:"templateName"`
	// TemplateVersionID pins the template version (a UUID). Empty on create
	// means the template's active version; changing it starts a build with
	// that version.
	// +optional
	TemplateVersionID string `json:"templateVersionID,omitempty"`
	// Running is the desired run state: true starts the workspace with a
	// start build, false stops it with a stop build. A workspace created
	// with running false is never left running.
	Running bool `json:"running"`
	// TTLMillis is how long the workspace runs after a start before Coder
	// stops it automatically; unset means no automatic stop.
	// +optional
	TTLMillis *int64 `json:"ttlMillis,omitempty"`
	// AutostartSchedule is a cron schedule with a time zone prefix
	// ("CRON_TZ=Europe/Berlin 30 9 * * 1-5") on which Coder starts the
	// workspace; unset means no autostart.
	// +optional
	AutostartSchedule *string `json:"autostartSchedule,omitempty"`
	// Parameters are the template's rich parameter values of the latest
	// build, without ephemeral ones (they apply to one build: set them
	// with coder start --ephemeral-parameter). Changing them starts a build with the new
	// values; coderd validates them. Parameters left out keep Coder's
	// values.
	// +optional
	// +listType=map
	// +listMapKey=name
	Parameters []WorkspaceParameter `json:"parameters,omitempty"`
	// Preset is the name of a preset of the template version: its
	// parameter values override spec.parameters. Reads show the preset
	// of the latest build, which coderd also picks by itself when the
	// values match one; omitted on update keeps it.
	// +optional
	Preset string `json:"preset,omitempty"`
	// AutomaticUpdates is "always" (a start builds the template's active
	// version) or "never"; omitted keeps Coder's value.
	// +optional
	AutomaticUpdates string `json:"automaticUpdates,omitempty"`
}

// WorkspaceParameter is one rich parameter value.
type WorkspaceParameter struct {
	// Name of the template parameter.
	Name string `json:"name"`
	// Value, as Coder stores it (lists are JSON arrays).
	Value string `json:"value"`
}

// CoderWorkspaceStatus is the workspace as coderd reports it.
type CoderWorkspaceStatus struct {
	// ID is the Coder workspace ID.
	// +optional
	ID string `json:"id,omitempty"`
	// Owner is the owner's Coder username.
	// +optional
	Owner string `json:"owner,omitempty"`
	// OwnerID is the owner's Coder user ID.
	// +optional
	OwnerID string `json:"ownerID,omitempty"`
	// Organization is the Coder organization name.
	// +optional
	Organization string `json:"organization,omitempty"`
	// OrganizationID is the Coder organization ID.
	// +optional
	OrganizationID string `json:"organizationID,omitempty"`
	// Template is the template name.
	// +optional
	Template string `json:"template,omitempty"`
	// TemplateDisplayName is the template's display name.
	// +optional
	TemplateDisplayName string `json:"templateDisplayName,omitempty"`
	// Phase is Coder's workspace status: pending, starting, running,
	// stopping, stopped, failed, canceling, canceled, deleting or deleted.
	// +optional
	Phase string `json:"phase,omitempty"`
	// LatestBuild is the most recent workspace build.
	// +optional
	LatestBuild *WorkspaceBuild `json:"latestBuild,omitempty"`
	// Outdated reports that the template has a newer active version.
	// +optional
	Outdated bool `json:"outdated,omitempty"`
	// Healthy reports whether every agent of the workspace is healthy.
	// +optional
	Healthy bool `json:"healthy,omitempty"`
	// Agents are the Coder agents of the latest build's resources, in
	// coderd's order.
	// +optional
	// +listType=atomic
	Agents []WorkspaceAgent `json:"agents,omitempty"`
	// AutoShutdownDeadline is when Coder stops the running workspace.
	// +optional
	AutoShutdownDeadline *metav1.Time `json:"autoShutdownDeadline,omitempty"`
	// LastUsedAt is the last time someone used the workspace.
	// +optional
	LastUsedAt *metav1.Time `json:"lastUsedAt,omitempty"`
	// URL opens the workspace in the Coder dashboard.
	// +optional
	URL string `json:"url,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (the start build succeeded and every agent is
	// connected and ready: the workspace is usable), Building (a build is
	// pending or running), and for kstatus Reconciling (a build runs or
	// the agents are coming up) and Stalled (the build or an agent
	// failed).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WorkspaceAgent is a Coder agent: the process in the workspace that
// connects it to coderd.
type WorkspaceAgent struct {
	// Name is the agent's name in the template (coder_agent's resource
	// name).
	Name string `json:"name"`
	// ID is the Coder agent ID.
	// +optional
	ID string `json:"id,omitempty"`
	// Status is the agent's connection to coderd: connecting, connected,
	// disconnected or timeout (not connected within the template's
	// connection timeout).
	Status string `json:"status"`
	// LifecycleState is how far the agent got: created, starting, ready,
	// start_timeout, start_error, shutting_down, shutdown_timeout,
	// shutdown_error or off.
	LifecycleState string `json:"lifecycleState"`
	// Healthy is Coder's health of the agent.
	Healthy bool `json:"healthy"`
	// HealthReason says why the agent is not healthy.
	// +optional
	HealthReason string `json:"healthReason,omitempty"`
	// Apps are the agent's apps (coder_app), in coderd's order.
	// +optional
	// +listType=atomic
	Apps []WorkspaceApp `json:"apps,omitempty"`
}

// WorkspaceApp is an app of a workspace agent.
type WorkspaceApp struct {
	// Slug names the app within its agent.
	Slug string `json:"slug"`
	// DisplayName is the name shown in the Coder dashboard.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// URL opens the app: through coderd's access URL for an app coderd
	// proxies by path, the app's own URL for an external app; empty for a
	// command app and for a subdomain app (its host needs coderd's
	// wildcard access URL: subdomainName is its first label).
	// +optional
	URL string `json:"url,omitempty"`
	// SubdomainName is the first label of a subdomain app's host.
	// +optional
	SubdomainName string `json:"subdomainName,omitempty"`
	// Health is the app's health check result: disabled (no health check),
	// initializing, healthy or unhealthy.
	Health string `json:"health"`
}

// WorkspaceBuild summarises a workspace build.
type WorkspaceBuild struct {
	// ID is the build ID.
	ID string `json:"id"`
	// Number counts the workspace's builds from 1.
	Number int32 `json:"number"`
	// Transition is start, stop or delete.
	Transition string `json:"transition"`
	// JobStatus is the provisioner job status: pending, running,
	// succeeded, canceling, canceled or failed.
	JobStatus string `json:"jobStatus"`
	// Error is the job's error message when it failed.
	// +optional
	Error string `json:"error,omitempty"`
	// TemplateVersionID is the template version the build used.
	// +optional
	TemplateVersionID string `json:"templateVersionID,omitempty"`
	// TemplateVersionName is that version's name.
	// +optional
	TemplateVersionName string `json:"templateVersionName,omitempty"`
	// Initiator is the username who started the build.
	// +optional
	Initiator string `json:"initiator,omitempty"`
	// CreatedAt is when the build was queued.
	CreatedAt metav1.Time `json:"createdAt"`
	// CompletedAt is when the build's job finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
}

// CoderWorkspaceList is a list of workspaces.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderWorkspaceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderWorkspace `json:"items"`
}
