// The CRD compatibility checker TestCRDCompatibility (crdcompat_test.go)
// runs: what a new CRD breaks for objects stored under the old one.

package chart

import (
	"bytes"
	"fmt"
	"maps"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// crdBreaks lists what cur breaks for objects created under old.
func crdBreaks(old, cur *apiextensionsv1.CustomResourceDefinition) []string {
	if cur == nil {
		return []string{"CRD removed"}
	}
	var out []string
	o, c := old.Spec, cur.Spec
	for _, f := range []struct{ what, old, cur string }{
		{"group", o.Group, c.Group},
		{"kind", o.Names.Kind, c.Names.Kind},
		{"plural", o.Names.Plural, c.Names.Plural},
		{"scope", string(o.Scope), string(c.Scope)},
	} {
		if f.old != f.cur {
			out = append(out, fmt.Sprintf("%s changed from %s to %s", f.what, f.old, f.cur))
		}
	}
	// Names users type: kubectl get ccp, kubectl get coder.
	for _, n := range o.Names.ShortNames {
		if !slices.Contains(c.Names.ShortNames, n) {
			out = append(out, "short name "+n+" removed")
		}
	}
	for _, n := range o.Names.Categories {
		if !slices.Contains(c.Names.Categories, n) {
			out = append(out, "category "+n+" removed")
		}
	}
	for _, ov := range o.Versions {
		i := slices.IndexFunc(c.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == ov.Name })
		if i < 0 {
			out = append(out, "version "+ov.Name+" removed")
			continue
		}
		cv := c.Versions[i]
		if (ov.Served || ov.Storage) && !cv.Served {
			out = append(out, "version "+ov.Name+" is no longer served")
		}
		if ov.Schema == nil || ov.Schema.OpenAPIV3Schema == nil {
			continue
		}
		if cv.Schema == nil || cv.Schema.OpenAPIV3Schema == nil {
			out = append(out, ov.Name+": schema removed")
			continue
		}
		for _, b := range schemaBreaks("", ov.Schema.OpenAPIV3Schema, cv.Schema.OpenAPIV3Schema) {
			out = append(out, ov.Name+": "+b)
		}
	}
	return out
}

// schemaBreaks walks an old schema and the new one at the same path.
func schemaBreaks(path string, old, cur *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	field := func(msg string, args ...any) {
		out = append(out, fmt.Sprintf("field %s "+msg, append([]any{orRoot(path)}, args...)...))
	}
	if old.Type != "" && cur.Type != old.Type {
		field("changed type from %s to %s", old.Type, cur.Type)
		return out
	}
	if len(old.Enum) > 0 || len(cur.Enum) > 0 {
		if len(old.Enum) == 0 {
			field("is now restricted to %d values", len(cur.Enum))
		}
		for _, e := range old.Enum {
			if len(cur.Enum) > 0 && !slices.ContainsFunc(cur.Enum, func(x apiextensionsv1.JSON) bool { return bytes.Equal(x.Raw, e.Raw) }) {
				field("no longer accepts %s", e.Raw)
			}
		}
	}
	if isTrue(old.XPreserveUnknownFields) && !isTrue(cur.XPreserveUnknownFields) {
		field("no longer preserves unknown fields")
	}
	for _, r := range cur.Required {
		if !slices.Contains(old.Required, r) {
			out = append(out, fmt.Sprintf("%s now requires %s", orRoot(path), r))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(old.Properties)) {
		op := old.Properties[name]
		cp, ok := cur.Properties[name]
		if !ok {
			if !isTrue(cur.XPreserveUnknownFields) {
				out = append(out, fmt.Sprintf("field %s removed", join(path, name)))
			}
			continue
		}
		out = append(out, schemaBreaks(join(path, name), &op, &cp)...)
	}
	if old.Items != nil && old.Items.Schema != nil {
		if cur.Items == nil || cur.Items.Schema == nil {
			field("no longer describes its items")
		} else {
			out = append(out, schemaBreaks(path+"[]", old.Items.Schema, cur.Items.Schema)...)
		}
	}
	if old.AdditionalProperties != nil && old.AdditionalProperties.Schema != nil {
		if cur.AdditionalProperties == nil || cur.AdditionalProperties.Schema == nil {
			if cur.AdditionalProperties == nil || !cur.AdditionalProperties.Allows {
				field("no longer allows its map's keys")
			}
		} else {
			out = append(out, schemaBreaks(path+".*", old.AdditionalProperties.Schema, cur.AdditionalProperties.Schema)...)
		}
	}
	return out
}

func isTrue(b *bool) bool { return b != nil && *b }
