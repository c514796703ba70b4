package templatesource_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
)

// TestVariables reads variable declarations as Coder's provisioner does:
// defaults in Coder's string form, required when there is none (or a
// null one), sensitive as declared, only the root module's .tf and
// .tf.json files.
func TestVariables(t *testing.T) {
	files := map[string]string{
		"main.tf": `
variable "namespace" {
  type = string
}
variable "use_kubeconfig" {
  type    = bool
  default = false
}
variable "replicas" {
  default = 3
}
variable "ratio" {
  default = 1.5
}
variable "zones" {
  type    = list(string)
  default = ["a", "b"]
}
variable "labels" {
  default = { team = "x" }
}
variable "token" {
  type      = string
  sensitive = true
  default   = "changeme"
}
variable "nothing" {
  default = null
}
resource "null_resource" "x" {}
`,
		"extra.tf.json":     `{"variable": {"image": {"default": "ubuntu:24.04"}}}`,
		"modules/m/vars.tf": `variable "inner" {}`,
		"README.md":         `variable "not_terraform" {}`,
	}
	got, err := templatesource.Variables(files)
	if err != nil {
		t.Fatal(err)
	}
	want := []templatesource.Variable{
		{Name: "image", Default: "ubuntu:24.04"},
		{Name: "labels", Default: `{"team":"x"}`},
		{Name: "namespace", Required: true},
		{Name: "nothing", Required: true},
		{Name: "ratio", Default: "1.5"},
		{Name: "replicas", Default: "3"},
		{Name: "token", Default: "changeme", Sensitive: true},
		{Name: "use_kubeconfig", Default: "false"},
		{Name: "zones", Default: `["a","b"]`},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Variables:\n got %+v\nwant %+v", got, want)
	}

	for name, tf := range map[string]string{
		"a syntax error":                     `variable "x" {`,
		"a declared twice":                   "variable \"x\" {}\nvariable \"x\" {}",
		"a default that refers to something": `variable "x" { default = var.y }`,
	} {
		if _, err := templatesource.Variables(map[string]string{"main.tf": tf}); err == nil || !strings.Contains(err.Error(), "main.tf") {
			t.Errorf("%s: error %v, want one naming main.tf", name, err)
		}
	}
}
