package v1alpha1

// TemplateParameter is a rich parameter a template version declares, as
// coderd reports it: what a workspace's spec.parameters may set.
type TemplateParameter struct {
	// Name is what spec.parameters names.
	Name string `json:"name"`
	// DisplayName is the name Coder's UI shows.
	// +optional
	DisplayName string `json:"displayName,omitempty"`
	// Description is the parameter's description (plain text).
	// +optional
	Description string `json:"description,omitempty"`
	// Type is string, number, bool or list(string).
	Type string `json:"type"`
	// Mutable parameters may change after the workspace is created.
	Mutable bool `json:"mutable"`
	// Ephemeral parameters apply to one build; spec.parameters refuses
	// them.
	// +optional
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Required parameters have no default: a create must set them.
	// +optional
	Required bool `json:"required,omitempty"`
	// Default is the value a workspace gets when it sets none.
	// +optional
	Default string `json:"default,omitempty"`
	// Options are the values allowed, when the parameter has options.
	// +optional
	// +listType=atomic
	Options []TemplateParameterOption `json:"options,omitempty"`
	// Validation is coderd's check of a value, when there is one.
	// +optional
	Validation *TemplateParameterValidation `json:"validation,omitempty"`
}

// TemplateParameterOption is one allowed value of a parameter.
type TemplateParameterOption struct {
	// Name is the option's label.
	Name string `json:"name"`
	// Value is what spec.parameters sets.
	Value string `json:"value"`
	// Description of the option.
	// +optional
	Description string `json:"description,omitempty"`
}

// TemplateParameterValidation is how coderd validates a parameter's value.
type TemplateParameterValidation struct {
	// Min is the smallest number allowed.
	// +optional
	Min *int32 `json:"min,omitempty"`
	// Max is the largest number allowed.
	// +optional
	Max *int32 `json:"max,omitempty"`
	// Monotonic is increasing or decreasing: a number may only move that
	// way.
	// +optional
	Monotonic string `json:"monotonic,omitempty"`
	// Regex a string must match.
	// +optional
	Regex string `json:"regex,omitempty"`
	// Error is the message coderd gives when the value fails.
	// +optional
	Error string `json:"error,omitempty"`
}

// TemplatePreset is a named set of parameter values of a template
// version: what a workspace's spec.preset names.
type TemplatePreset struct {
	// Name is what spec.preset names.
	Name string `json:"name"`
	// Default marks the preset Coder's UI selects first.
	// +optional
	Default bool `json:"default,omitempty"`
	// Description of the preset.
	// +optional
	Description string `json:"description,omitempty"`
	// Parameters are the values the preset sets.
	// +optional
	// +listType=map
	// +listMapKey=name
	Parameters []WorkspaceParameter `json:"parameters,omitempty"`
}
