package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/coderstatus"
)

// The parameter rules of a workspace's spec. coderd validates the values
// (options, ranges, regexes, immutability); coder-k8s only checks what
// would break the round trip of a write: a parameter the version does
// not declare (coderd drops it), an ephemeral one (it applies to one
// build, so no read shows it) and a preset that does not exist or that
// overrides a value the same spec sets.

// versionParameters is what a template version declares for the
// workspaces built from it: its rich parameters and its presets. A
// version that has been built from never changes them.
type versionParameters struct {
	params  []codersdk.TemplateVersionParameter
	presets []codersdk.Preset
}

// fetchVersionParameters asks coderd for a version's parameters and
// presets.
func fetchVersionParameters(ctx context.Context, c *codersdk.Client, id uuid.UUID) (versionParameters, error) {
	params, err := c.TemplateVersionRichParameters(ctx, id)
	if err != nil {
		return versionParameters{}, fmt.Errorf("parameters of template version %s: %w", id, err)
	}
	presets, err := c.TemplateVersionPresets(ctx, id)
	if err != nil {
		return versionParameters{}, fmt.Errorf("presets of template version %s: %w", id, err)
	}
	return versionParameters{params: params, presets: presets}, nil
}

// versionParamCache remembers the parameters of built versions, so a
// read shows a build's preset and hides its ephemeral values, and a
// version shows its parameters, at the cost of two requests per version.
type versionParamCache struct {
	coderdFacts[uuid.UUID, versionParameters]
}

func newVersionParamCache() versionParamCache {
	return versionParamCache{coderdFacts[uuid.UUID, versionParameters]{max: 10000}}
}

// get returns the parameters of version id, which has built (a workspace
// build used it, or its import succeeded), so they are final.
func (c *versionParamCache) get(ctx context.Context, t target, id uuid.UUID) (versionParameters, error) {
	return c.coderdFacts.get(ctx, t, id, func(ctx context.Context) (versionParameters, bool, error) {
		v, err := fetchVersionParameters(ctx, t.Client, id)
		return v, err == nil, err
	})
}

// specView completes a workspace's spec from its latest build: the
// preset by name and the parameters without ephemeral ones. params is
// shared with the build cache, so a filtered list is a new slice.
func (v versionParameters) specView(spec *aggv1.CoderWorkspaceSpec, preset *uuid.UUID) {
	if preset != nil {
		if i := slices.IndexFunc(v.presets, func(p codersdk.Preset) bool { return p.ID == *preset }); i >= 0 {
			spec.Preset = v.presets[i].Name
		}
	}
	if !slices.ContainsFunc(spec.Parameters, func(p aggv1.WorkspaceParameter) bool { return v.ephemeral(p.Name) }) {
		return
	}
	kept := make([]aggv1.WorkspaceParameter, 0, len(spec.Parameters))
	for _, p := range spec.Parameters {
		if !v.ephemeral(p.Name) {
			kept = append(kept, p)
		}
	}
	spec.Parameters = kept
}

func (v versionParameters) ephemeral(name string) bool {
	return slices.ContainsFunc(v.params, func(p codersdk.TemplateVersionParameter) bool { return p.Name == name && p.Ephemeral })
}

// check refuses what coderd would accept but no read could show back:
// unknown and ephemeral parameters, and an unknown preset. A preset that
// would override a value set beside it is refused when strict (the spec
// names both), and otherwise dropped: a workspace whose preset values
// change no longer has that preset, as in Coder. It returns the preset's
// ID (uuid.Nil without one).
func (v versionParameters) check(spec *aggv1.CoderWorkspaceSpec, version uuid.UUID, strict bool) (uuid.UUID, field.ErrorList) {
	var errs field.ErrorList
	path := specPath.Child("parameters")
	for _, p := range spec.Parameters {
		i := slices.IndexFunc(v.params, func(d codersdk.TemplateVersionParameter) bool { return d.Name == p.Name })
		switch {
		case i < 0:
			errs = append(errs, &field.Error{Type: field.ErrorTypeNotFound, Field: path.Key(p.Name).String(), BadValue: field.OmitValueType{},
				Detail: fmt.Sprintf("template version %s has no parameter %q (it has: %s)", version, p.Name, v.parameterNames())})
		case v.params[i].Ephemeral:
			errs = append(errs, field.Forbidden(path.Key(p.Name), fmt.Sprintf("parameter %q is ephemeral: it applies to one build only, so a read could never show it back; "+
				"set it for one build with `coder start --ephemeral-parameter %s=VALUE`", p.Name, p.Name)))
		}
	}
	if spec.Preset == "" {
		return uuid.Nil, errs
	}
	i := slices.IndexFunc(v.presets, func(p codersdk.Preset) bool { return p.Name == spec.Preset })
	if i < 0 && !strict {
		return uuid.Nil, errs // the workspace's preset, gone from the version it moves to
	}
	if i < 0 {
		names := make([]string, len(v.presets))
		for j, p := range v.presets {
			names[j] = p.Name
		}
		slices.Sort(names)
		return uuid.Nil, append(errs, field.NotSupported(specPath.Child("preset"), spec.Preset, names))
	}
	preset := v.presets[i]
	for _, pp := range preset.Parameters {
		j := slices.IndexFunc(spec.Parameters, func(p aggv1.WorkspaceParameter) bool { return p.Name == pp.Name })
		if j >= 0 && spec.Parameters[j].Value != pp.Value {
			if !strict {
				return uuid.Nil, errs
			}
			errs = append(errs, field.Invalid(path.Key(pp.Name), spec.Parameters[j].Value,
				fmt.Sprintf("preset %q sets %s to %q, and a preset's values win: drop one of the two", preset.Name, pp.Name, pp.Value)))
		}
	}
	return preset.ID, errs
}

func (v versionParameters) parameterNames() string {
	if len(v.params) == 0 {
		return "none"
	}
	names := make([]string, len(v.params))
	for i, p := range v.params {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// buildErr is coderErr for a request that builds the workspace: coderd
// keys its parameter validations by parameter name, which becomes the
// field path spec.parameters[name], the form kubectl shows for a keyed
// list.
func (s *WorkspaceStorage) buildErr(t target, err error, name string, create bool) error {
	var sdkErr *codersdk.Error
	if errors.As(err, &sdkErr) && len(sdkErr.Validations) > 0 {
		fields := make(map[string]string, len(s.fields)+len(sdkErr.Validations))
		maps.Copy(fields, s.fields)
		for _, v := range sdkErr.Validations {
			if _, ok := fields[v.Field]; !ok {
				fields[v.Field] = specPath.Child("parameters").Key(v.Field).String()
			}
		}
		tgt := s.statusTarget(t, name)
		tgt.Fields, tgt.Create = fields, create
		return coderstatus.Error(err, tgt)
	}
	if create {
		return s.createErr(t, err, name)
	}
	return s.coderErr(t, err, name)
}

// status is the version's parameters and presets as
// CoderTemplateVersion's status shows them.
func (v versionParameters) status() ([]aggv1.TemplateParameter, []aggv1.TemplatePreset) {
	var params []aggv1.TemplateParameter
	for _, p := range v.params {
		tp := aggv1.TemplateParameter{Name: p.Name, DisplayName: p.DisplayName, Description: p.DescriptionPlaintext, Type: p.Type,
			Mutable: p.Mutable, Ephemeral: p.Ephemeral, Required: p.Required, Default: p.DefaultValue}
		for _, o := range p.Options {
			tp.Options = append(tp.Options, aggv1.TemplateParameterOption{Name: o.Name, Value: o.Value, Description: o.Description})
		}
		if p.ValidationMin != nil || p.ValidationMax != nil || p.ValidationRegex != "" || p.ValidationError != "" || p.ValidationMonotonic != "" {
			tp.Validation = &aggv1.TemplateParameterValidation{Min: p.ValidationMin, Max: p.ValidationMax, Monotonic: string(p.ValidationMonotonic),
				Regex: p.ValidationRegex, Error: p.ValidationError}
		}
		params = append(params, tp)
	}
	var presets []aggv1.TemplatePreset
	for _, p := range v.presets {
		tp := aggv1.TemplatePreset{Name: p.Name, Default: p.Default, Description: p.Description}
		for _, pp := range p.Parameters {
			tp.Parameters = append(tp.Parameters, aggv1.WorkspaceParameter{Name: pp.Name, Value: pp.Value})
		}
		presets = append(presets, tp)
	}
	return params, presets
}
