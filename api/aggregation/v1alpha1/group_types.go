package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CoderGroup is a Coder group of an organization seen through Kubernetes.
// Its name is <organization>.<group>, or <control plane>.<organization>.<group>
// when the namespace has more than one control plane. Groups need Coder's
// template_rbac feature: a coderd without it (the open-source build, or
// an Enterprise build whose license lacks it) has none to show, and
// refuses every write (422 naming the feature).
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the group as declared.
	Spec CoderGroupSpec `json:"spec,omitempty"`
	// Status is the group as coderd reports it.
	// +optional
	Status CoderGroupStatus `json:"status,omitempty"`
}

// CoderGroupSpec is what a user sets on a group. A field left unset keeps
// Coder's value.
type CoderGroupSpec struct {
	// Organization is the Coder organization name. It is part of the
	// object name; when set it must agree with it.
	// +optional
	Organization string `json:"organization,omitempty"`
	// DisplayName is the name the Coder dashboard shows.
	// +optional
	DisplayName *string `json:"displayName,omitempty"`
	// AvatarURL is the group's avatar.
	// +optional
	AvatarURL *string `json:"avatarURL,omitempty"`
	// Members are the Coder usernames of the group's members: when set,
	// the whole set (members Coder has that are not listed are removed,
	// an empty list removes everyone); unset keeps Coder's members. A
	// read shows Coder's members, sorted. The organization's Everyone
	// group has every member of the organization and cannot be changed.
	// +optional
	// +listType=set
	Members []string `json:"members,omitempty"`
	// QuotaAllowance is the workspace quota credits each member gets from
	// this group.
	// +optional
	// +kubebuilder:validation:Minimum=0
	QuotaAllowance *int32 `json:"quotaAllowance,omitempty"`
}

// CoderGroupStatus is the group as coderd reports it.
type CoderGroupStatus struct {
	// ID is the Coder group ID.
	// +optional
	ID string `json:"id,omitempty"`
	// OrganizationID is the Coder organization ID.
	// +optional
	OrganizationID string `json:"organizationID,omitempty"`
	// Source is where the group comes from: user (made in Coder or
	// here) or oidc (synced from the identity provider).
	// +optional
	Source string `json:"source,omitempty"`
	// MemberCount is how many members the group has.
	// +optional
	MemberCount int32 `json:"memberCount,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// CoderGroupList is a list of groups.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderGroup `json:"items"`
}

// CoderOrganization is a Coder organization seen through Kubernetes. Its
// name is the organization's name, or <control plane>.<organization> when
// the namespace has more than one control plane. Every coderd shows its
// organizations; creating, changing and deleting one needs Coder's
// multiple_organizations feature (422 naming it on a coderd without).
// The object's name is the Coder name, so a rename in Coder is a new
// object, not an update.
//
// +genclient
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderOrganization struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the organization as declared.
	Spec CoderOrganizationSpec `json:"spec,omitempty"`
	// Status is the organization as coderd reports it.
	// +optional
	Status CoderOrganizationStatus `json:"status,omitempty"`
}

// CoderOrganizationSpec is what a user sets on an organization. A field
// left unset keeps Coder's value.
type CoderOrganizationSpec struct {
	// DisplayName is the name the Coder dashboard shows.
	// +optional
	DisplayName *string `json:"displayName,omitempty"`
	// Description describes the organization.
	// +optional
	Description *string `json:"description,omitempty"`
	// Icon is the organization's icon (a URL or a path coderd serves).
	// +optional
	Icon *string `json:"icon,omitempty"`
}

// CoderOrganizationStatus is the organization as coderd reports it.
type CoderOrganizationStatus struct {
	// ID is the Coder organization ID.
	// +optional
	ID string `json:"id,omitempty"`
	// Default says this is coderd's default organization (it cannot be
	// deleted).
	// +optional
	Default bool `json:"default,omitempty"`
	// MembersCount is how many members the organization has.
	// +optional
	MembersCount int32 `json:"membersCount,omitempty"`
	// ObservedGeneration is the metadata.generation this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// CoderOrganizationList is a list of organizations.
//
// +kubebuilder:object:root=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type CoderOrganizationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CoderOrganization `json:"items"`
}
