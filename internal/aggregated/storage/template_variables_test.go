package storage

import (
	"strings"
	"testing"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func fxSecretVar(name, secret, key string) aggv1.TemplateVariable {
	return aggv1.TemplateVariable{Name: name, ValueFrom: &aggv1.TemplateVariableSource{SecretKeyRef: &aggv1.SecretKeySelector{Name: secret, Key: key}}}
}

// TestValidateVariables checks spec.variables' shape with field paths.
func TestValidateVariables(t *testing.T) {
	vars := []aggv1.TemplateVariable{
		{Name: "a", Value: "1"},
		{Name: "a", Value: "2"},
		{Value: "nameless"},
		{Name: "both", Value: "x", ValueFrom: &aggv1.TemplateVariableSource{SecretKeyRef: &aggv1.SecretKeySelector{Name: "s", Key: "k"}}},
		{Name: "nosource", ValueFrom: &aggv1.TemplateVariableSource{}},
		fxSecretVar("noname", "", ""),
		fxSecretVar("ok", "s", "k"),
	}
	var got []string
	for _, e := range validateVariables(vars) {
		got = append(got, e.Error())
	}
	want := []string{
		`spec.variables[1].name: Duplicate value: "a"`,
		`spec.variables[2].name: Required value: the Terraform variable's name`,
		`spec.variables[3].valueFrom: Forbidden: give value or valueFrom, not both`,
		`spec.variables[4].valueFrom.secretKeyRef: Required value: the Secret key the value is read from`,
		`spec.variables[5].valueFrom.secretKeyRef.name: Required value: the Secret's name`,
		`spec.variables[5].valueFrom.secretKeyRef.key: Required value: the key of the Secret's data`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("validateVariables:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestSameVariables: the order of spec.variables does not matter; a
// value, a Secret or its key does.
func TestSameVariables(t *testing.T) {
	a := []aggv1.TemplateVariable{{Name: "x", Value: "1"}, fxSecretVar("y", "s", "k")}
	for _, c := range []struct {
		b    []aggv1.TemplateVariable
		same bool
	}{
		{[]aggv1.TemplateVariable{fxSecretVar("y", "s", "k"), {Name: "x", Value: "1"}}, true},
		{[]aggv1.TemplateVariable{{Name: "x", Value: "2"}, fxSecretVar("y", "s", "k")}, false},
		{[]aggv1.TemplateVariable{{Name: "x", Value: "1"}, fxSecretVar("y", "s", "other")}, false},
		{[]aggv1.TemplateVariable{{Name: "x", Value: "1"}, {Name: "y"}}, false},
		{[]aggv1.TemplateVariable{{Name: "x", Value: "1"}}, false},
	} {
		if got := sameVariables(a, c.b); got != c.same {
			t.Errorf("sameVariables(%+v, %+v) = %v, want %v", a, c.b, got, c.same)
		}
	}
	if !sameVariables(nil, []aggv1.TemplateVariable{}) {
		t.Error("no variables and an empty list differ")
	}
}
