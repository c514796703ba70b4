package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderUser is a Coder user seen through Kubernetes. Its name is the
// Coder username, or <control plane>.<username> when the namespace has
// more than one control plane. Creating one creates the user in Coder;
// deleting one deletes it (coderd refuses while the user owns
// workspaces).
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderUser struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the user as declared.
	Spec CoderUserSpec `json:"spec,omitempty"`
	// Status is the user as coderd reports it.
	// +optional
	Status CoderUserStatus `json:"status,omitempty"`
}

// CoderUserSpec is what a user sets on a Coder user.
type CoderUserSpec struct {
	// Email is the user's email address. Required on create; it cannot
	// change (coderd has no API to change it).
	// +optional
	Email string `json:"email,omitempty"`
	// Name is the user's full name (Coder's profile name).
	// +optional
	Name string `json:"name,omitempty"`
	// LoginType is how the user logs in: password, none (a machine
	// account: only tokens an owner mints), github or oidc. Unset on
	// create is coderd's default, password. It cannot change.
	// +optional
	LoginType string `json:"loginType,omitempty"`
	// Suspended says the user is suspended: they cannot log in or use
	// their tokens. False activates a suspended user; a dormant user
	// (never logged in, or inactive) reads as not suspended. Always
	// read back, false too, so that a manifest saying suspended: false
	// sees a suspension made in Coder as drift.
	// +optional
	Suspended bool `json:"suspended"`
	// Roles are the user's site roles (owner, template-admin,
	// user-admin, auditor), applied as a whole. Unset keeps Coder's;
	// every user is also a member, which is not listed.
	// +optional
	// +listType=set
	Roles []string `json:"roles,omitempty"`
	// Organizations are the user's organization memberships with their
	// organization roles, applied as a whole: organizations Coder has
	// that the list lacks are left. Unset keeps Coder's (on create: the
	// default organization).
	// +optional
	// +listType=map
	// +listMapKey=name
	Organizations []CoderUserOrganization `json:"organizations,omitempty"`
	// PasswordSecretRef names the key of a Secret in the object's
	// namespace that holds the user's password (login type password
	// only). coder-k8s reads it only when the writer may get that
	// Secret, and the value goes nowhere but coderd. The password is set
	// on create, when the reference changes and when the Secret changed
	// since it was last read (on the next write).
	// +optional
	PasswordSecretRef *SecretKeySelector `json:"passwordSecretRef,omitempty"`
}

// CoderUserOrganization is one organization membership of a user.
type CoderUserOrganization struct {
	// Name is the organization's name.
	Name string `json:"name"`
	// Roles are the user's organization roles (organization-admin,
	// organization-user-admin, organization-template-admin,
	// organization-auditor, or custom ones), applied as a whole; every
	// member is also organization-member, which is not listed.
	// +optional
	// +listType=set
	Roles []string `json:"roles,omitempty"`
}

// CoderUserStatus is the user as coderd reports it.
type CoderUserStatus struct {
	// ID is the Coder user ID.
	// +optional
	ID string `json:"id,omitempty"`
	// Status is Coder's user status: active, dormant or suspended.
	// +optional
	Status string `json:"status,omitempty"`
	// LoginType is how the user logs in.
	// +optional
	LoginType string `json:"loginType,omitempty"`
	// CreatedAt is when coderd created the user.
	// +optional
	CreatedAt *metav1.Time `json:"createdAt,omitempty"`
	// UpdatedAt is when coderd last changed the user.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
	// LastSeenAt is when the user last used Coder.
	// +optional
	LastSeenAt *metav1.Time `json:"lastSeenAt,omitempty"`
	// OrganizationIDs are the IDs of the user's organizations.
	// +optional
	// +listType=set
	OrganizationIDs []string `json:"organizationIDs,omitempty"`
	// PasswordSecretResourceVersion is the resourceVersion of the
	// Secret the password was last read from (never the password).
	// +optional
	PasswordSecretResourceVersion string `json:"passwordSecretResourceVersion,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// CoderUserList is a list of users.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderUserList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderUser `json:"items"`
}
