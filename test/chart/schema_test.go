package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/config"
)

// The config keys the chart renders from its own values; the schema
// refuses them under `config`.
var chartOwnedConfigKeys = []string{
	"app",
	"controller.healthProbeBindAddress",
	"controller.metricsBindAddress",
	"controller.workspaceRBAC",
	"aggregatedAPIServer.securePort",
	"aggregatedAPIServer.certDir",
	"aggregatedAPIServer.autoTLS",
	"aggregatedAPIServer.coder.staticBackend",
	"aggregatedAPIServer.identity",
	"aggregatedAPIServer.admission",
	"mcp.bindAddress",
}

func chartOwned(key string) bool {
	for _, k := range chartOwnedConfigKeys {
		if key == k || strings.HasPrefix(key, k+".") {
			return true
		}
	}
	return false
}

// TestSchemaKnowsEveryConfigKey: values.schema.json's `config` has every
// key of the fully defaulted configuration file (except the ones the chart
// owns) with a matching type, and no key the binary does not know.
func TestSchemaKnowsEveryConfigKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	cfgSchema, _ := lookup(schema, "properties.config").(map[string]any)
	if cfgSchema == nil {
		t.Fatal("values.schema.json has no properties.config")
	}
	fields := map[string]config.Field{}
	for _, f := range config.Fields() {
		fields[f.Key] = f
	}
	js, err := json.Marshal(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := json.Unmarshal(js, &defaults); err != nil {
		t.Fatal(err)
	}

	var checked int
	var walk func(obj map[string]any, node map[string]any, prefix string)
	walk = func(obj map[string]any, node map[string]any, prefix string) {
		if node["type"] != "object" || node["additionalProperties"] != false {
			t.Errorf("schema config%s: type %v, additionalProperties %v; want a closed object", dotted(prefix), node["type"], node["additionalProperties"])
		}
		props, _ := node["properties"].(map[string]any)
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			full := prefix + key
			sub, inSchema := props[key].(map[string]any)
			if chartOwned(full) {
				if inSchema {
					t.Errorf("schema config.%s: the chart renders this key, so the schema must refuse it", full)
				}
				continue
			}
			if !inSchema {
				t.Errorf("schema config has no %s (default %v): users cannot set it", full, obj[key])
				continue
			}
			checked++
			if v, ok := obj[key].(map[string]any); ok {
				walk(v, sub, full+".")
				continue
			}
			if want := schemaType(fields[full]); !hasType(sub["type"], want) {
				t.Errorf("schema config.%s has type %v, the binary reads %s (%s)", full, sub["type"], want, fields[full].Type)
			}
		}
		// And nothing the binary would refuse as an unknown field.
		for key := range props {
			if _, ok := fields[prefix+key]; !ok {
				t.Errorf("schema config.%s%s is not a key of the configuration file", prefix, key)
			}
		}
	}
	walk(defaults, cfgSchema, "")
	if checked < 30 {
		t.Errorf("only %d keys checked: the walk went wrong", checked)
	}
	// The walk covers every key config.Fields() lists.
	// (Lists default to null.)
	for key, f := range fields {
		if lookup(defaults, key) == nil && f.Type.Kind() != reflect.Slice {
			t.Errorf("config.Default() JSON has no %s", key)
		}
	}
}

func dotted(prefix string) string {
	if prefix == "" {
		return ""
	}
	return "." + strings.TrimSuffix(prefix, ".")
}

// hasType reports whether a schema's type (a string or a list of them)
// includes want.
func hasType(typ any, want string) bool {
	switch typ := typ.(type) {
	case string:
		return typ == want
	case []any:
		return slices.Contains(typ, any(want))
	}
	return false
}

// schemaType is the JSON schema type of a configuration field.
func schemaType(f config.Field) string {
	switch {
	case f.Type == reflect.TypeOf(config.Duration{}):
		return "string"
	case f.IsObject():
		return "object"
	}
	switch f.Type.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		return "array"
	default:
		return "string"
	}
}

// TestSchemaRejectsMisspelledValues: the Helm library's values validation
// (what `helm install` and `helm template` run) refuses a misspelt key and
// names it with its path.
func TestSchemaRejectsMisspelledValues(t *testing.T) {
	cases := []struct {
		name, values string
		want         []string
	}{
		{"top-level value", "replicasCount: 2", []string{"at ''", "additional properties 'replicasCount' not allowed"}},
		{"nested value", "tls: {mdoe: auto}", []string{"at '/tls'", "'mdoe' not allowed"}},
		{"config key", "config: {logging: {levle: debug}}", []string{"at '/config/logging'", "additional properties 'levle' not allowed"}},
		{"config section", "config: {controler: {}}", []string{"at '/config'", "'controler' not allowed"}},
		{"config value of the wrong type", "config: {kubernetes: {burst: many}}", []string{"/config/kubernetes/burst"}},
		{"config duration", "config: {mcp: {toolTimeout: 2 minutes}}", []string{"/config/mcp/toolTimeout"}},
		{"mode", "mode: controllers", []string{"/mode"}},
	}
	for _, key := range chartOwnedConfigKeys {
		parent, leaf := "", key
		if i := strings.LastIndex(key, "."); i >= 0 {
			parent, leaf = key[:i], key[i+1:]
		}
		// {config: {a: {b: {leaf: x}}}}
		v := "x"
		y := fmt.Sprintf("{%s: %s}", leaf, v)
		for _, p := range slices.Backward(strings.Split(parent, ".")) {
			if p != "" {
				y = fmt.Sprintf("{%s: %s}", p, y)
			}
		}
		at := "/config"
		if parent != "" {
			at += "/" + strings.ReplaceAll(parent, ".", "/")
		}
		cases = append(cases, struct {
			name, values string
			want         []string
		}{"chart-owned config." + key, "config: " + y, []string{"at '" + at + "'", "'" + leaf + "' not allowed"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(t, renderOptions{}, valuesFromYAML(t, c.values))
			if err == nil {
				t.Fatalf("values %q rendered without an error", c.values)
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Errorf("values %q: not a schema error: %v", c.values, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("values %q: error does not contain %q:\n%v", c.values, w, err)
				}
			}
		})
	}
}
