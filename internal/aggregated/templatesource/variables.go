package templatesource

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// Variable is a Terraform variable that a template's root module declares,
// as Coder's provisioner reads it when it imports the files (coder
// v2.30.0 provisioner/terraform/tfparse, through terraform-config-inspect).
type Variable struct {
	Name string
	// Default is the default in Coder's string form: a string as it is,
	// any other value as JSON. Empty when Required.
	Default string
	// Required: the declaration has no default (or a null one).
	Required bool
	// Sensitive: the declaration says sensitive = true.
	Sensitive bool
}

// variableSchema picks the variable blocks out of a file, leaving the rest.
var variableSchema = &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "variable", LabelNames: []string{"name"}}}}

// variableBodySchema is what is read of a variable block.
var variableBodySchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "default"}, {Name: "sensitive"}}}

// Variables reads the variables declared by the root module of files (the
// .tf and .tf.json files at the top level, as Coder imports them), sorted
// by name. It fails when a file does not parse: the import would fail too.
//
// Knowing them before Coder imports the files is what lets a CoderTemplate
// give every variable its value explicitly: a template version that does
// not name a variable inherits the active version's value (coderd
// includeLastVariableValues), and Coder's API redacts a sensitive
// variable's default, so it cannot be learnt from Coder.
func Variables(files map[string]string) ([]Variable, error) {
	names := make([]string, 0, len(files))
	for p := range files {
		if path.Dir(p) == "." && (strings.HasSuffix(p, ".tf") || strings.HasSuffix(p, ".tf.json")) {
			names = append(names, p)
		}
	}
	sort.Strings(names)
	parser := hclparse.NewParser()
	seen := map[string]bool{}
	var out []Variable
	for _, p := range names {
		var f *hcl.File
		var diags hcl.Diagnostics
		if strings.HasSuffix(p, ".json") {
			f, diags = parser.ParseJSON([]byte(files[p]), p)
		} else {
			f, diags = parser.ParseHCL([]byte(files[p]), p)
		}
		if diags.HasErrors() {
			return nil, fmt.Errorf("parse %s: %w", p, diags)
		}
		content, _, diags := f.Body.PartialContent(variableSchema)
		if diags.HasErrors() {
			return nil, fmt.Errorf("read %s: %w", p, diags)
		}
		for _, b := range content.Blocks {
			v, err := readVariable(b)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if seen[v.Name] {
				return nil, fmt.Errorf("%s: variable %q is declared twice", p, v.Name)
			}
			seen[v.Name] = true
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// readVariable reads one variable block as terraform-config-inspect does:
// the default evaluated without variables or functions, turned into plain
// JSON, and Coder's string form of that.
func readVariable(b *hcl.Block) (Variable, error) {
	v := Variable{Name: b.Labels[0]}
	content, _, diags := b.Body.PartialContent(variableBodySchema)
	if diags.HasErrors() {
		return v, fmt.Errorf("variable %q: %w", v.Name, diags)
	}
	if attr, ok := content.Attributes["sensitive"]; ok {
		if diags := gohcl.DecodeExpression(attr.Expr, nil, &v.Sensitive); diags.HasErrors() {
			return v, fmt.Errorf("variable %q: sensitive: %w", v.Name, diags)
		}
	}
	attr, ok := content.Attributes["default"]
	if !ok {
		v.Required = true
		return v, nil
	}
	val, diags := attr.Expr.Value(nil)
	if diags.HasErrors() {
		return v, fmt.Errorf("variable %q: default: %w", v.Name, diags)
	}
	if !val.IsWhollyKnown() {
		return v, fmt.Errorf("variable %q: default is not a constant", v.Name)
	}
	raw, err := ctyjson.Marshal(val, val.Type())
	if err != nil {
		return v, fmt.Errorf("variable %q: default: %w", v.Name, err)
	}
	var plain any
	if err := json.Unmarshal(raw, &plain); err != nil {
		return v, fmt.Errorf("variable %q: default: %w", v.Name, err)
	}
	switch d := plain.(type) {
	case nil:
		// A null default is no default to Coder.
		v.Required = true
	case string:
		v.Default = d
	default:
		s, err := json.Marshal(d)
		if err != nil {
			return v, fmt.Errorf("variable %q: default: %w", v.Name, err)
		}
		v.Default = string(s)
	}
	return v, nil
}
