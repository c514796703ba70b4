package chart

import (
	"maps"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestCRDCompatibility compares every CRD of the previous release with
// the one users get now, from the chart and from config/crd/bases: objects
// stored under the old CRD must stay readable and valid, so no version
// may stop being served, no field may go, change type or lose enum
// values, and no field may become required where old objects exist.
func TestCRDCompatibility(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	old := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, f := range prev.Files {
		if strings.HasPrefix(f.Name, "files/crds/") && strings.HasSuffix(f.Name, ".yaml") {
			crd := parseCRD(t, f.Name, f.Data)
			old[crd.Name] = crd
		}
	}
	if len(old) == 0 {
		t.Fatal("the previous chart holds no CRDs in files/crds")
	}
	for _, dir := range []string{"charts/coder-k8s/files/crds", "config/crd/bases"} {
		t.Run(dir, func(t *testing.T) {
			cur := map[string]*apiextensionsv1.CustomResourceDefinition{}
			for _, f := range crdFiles(t, dir) {
				crd := readCRD(t, f)
				cur[crd.Name] = crd
			}
			for _, name := range slices.Sorted(maps.Keys(old)) {
				for _, b := range crdBreaks(old[name], cur[name]) {
					t.Errorf("%s: %s", name, b)
				}
			}
		})
	}
}

// TestCRDCompatibilityCheckFindsBreaks: the check above reports each kind
// of break with the field's path, and accepts compatible changes.
func TestCRDCompatibilityCheckFindsBreaks(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	old := parseCRD(t, "codercontrolplanes", chartFile(t, prev, "files/crds/coder.com_codercontrolplanes.yaml"))
	// edit changes a copy of the CRD's first version as unstructured
	// data; at is the path of a field of spec in the schema.
	edit := func(f func(version map[string]any)) *apiextensionsv1.CustomResourceDefinition {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(old.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		versions, _, _ := unstructured.NestedSlice(m, "spec", "versions")
		v0 := versions[0].(map[string]any)
		f(v0)
		versions[0] = v0
		if err := unstructured.SetNestedSlice(m, versions, "spec", "versions"); err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, crd); err != nil {
			t.Fatal(err)
		}
		return crd
	}
	at := func(fields ...string) []string {
		p := []string{"schema", "openAPIV3Schema", "properties", "spec"}
		for _, f := range fields {
			p = append(p, "properties", f)
		}
		return p
	}
	set := func(v map[string]any, value any, path ...string) {
		if err := unstructured.SetNestedField(v, value, path...); err != nil {
			t.Fatalf("set %v: %v", path, err)
		}
	}
	get := func(v map[string]any, path ...string) any {
		x, ok, err := unstructured.NestedFieldNoCopy(v, path...)
		if !ok || err != nil {
			t.Fatalf("no field %v in the CRD (%v)", path, err)
		}
		return x
	}

	if b := crdBreaks(old, old.DeepCopy()); len(b) > 0 {
		t.Errorf("an unchanged CRD breaks: %v", b)
	}
	v := old.Spec.Versions[0].Name
	for _, tc := range []struct {
		name string
		crd  *apiextensionsv1.CustomResourceDefinition
		want []string // nil: compatible
	}{{
		name: "field removed",
		crd: edit(func(v map[string]any) {
			get(v, at("operatorAccess", "tokenLifetime")...)
			unstructured.RemoveNestedField(v, at("operatorAccess", "tokenLifetime")...)
		}),
		want: []string{v + ": field spec.operatorAccess.tokenLifetime removed"},
	}, {
		name: "field removed inside a list",
		crd: edit(func(v map[string]any) {
			p := append(at("env"), "items", "properties", "valueFrom")
			get(v, p...)
			unstructured.RemoveNestedField(v, p...)
		}),
		want: []string{v + ": field spec.env[].valueFrom removed"},
	}, {
		name: "new required field",
		crd: edit(func(v map[string]any) {
			req, _, _ := unstructured.NestedSlice(v, append(at(), "required")...)
			set(v, append(slices.Clone(req), "accessURL"), append(at(), "required")...)
		}),
		want: []string{v + ": spec now requires accessURL"},
	}, {
		name: "type changed",
		crd: edit(func(v map[string]any) {
			set(v, "string", append(at("replicas"), "type")...)
			unstructured.RemoveNestedField(v, append(at("replicas"), "format")...)
		}),
		want: []string{v + ": field spec.replicas changed type from integer to string"},
	}, {
		name: "enum value removed",
		crd: edit(func(v map[string]any) {
			enum := get(v, append(at("service", "type"), "enum")...).([]any)
			set(v, slices.DeleteFunc(slices.Clone(enum), func(e any) bool { return e == "LoadBalancer" }), append(at("service", "type"), "enum")...)
		}),
		want: []string{v + `: field spec.service.type no longer accepts "LoadBalancer"`},
	}, {
		name: "version no longer served",
		crd:  edit(func(v map[string]any) { set(v, false, "served") }),
		want: []string{"version " + v + " is no longer served"},
	}, {
		name: "short name removed",
		crd: func() *apiextensionsv1.CustomResourceDefinition {
			crd := old.DeepCopy()
			crd.Spec.Names.ShortNames = nil
			return crd
		}(),
		want: []string{"short name ccp removed"},
	}, {
		name: "new optional field with required fields of its own",
		crd: edit(func(v map[string]any) {
			set(v, map[string]any{
				"type":       "object",
				"required":   []any{"name"},
				"properties": map[string]any{"name": map[string]any{"type": "string"}},
			}, at("newThing")...)
		}),
	}, {
		name: "enum value added",
		crd: edit(func(v map[string]any) {
			enum := get(v, append(at("service", "type"), "enum")...).([]any)
			set(v, append(slices.Clone(enum), "ExternalName"), append(at("service", "type"), "enum")...)
		}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := crdBreaks(old, tc.crd)
			if !slices.Equal(got, tc.want) {
				t.Errorf("breaks %q, want %q", got, tc.want)
			}
			// The original is untouched, so the cases are independent.
			if b := crdBreaks(old, old.DeepCopy()); len(b) > 0 {
				t.Fatalf("the case changed the original CRD: %v", b)
			}
		})
	}
}
