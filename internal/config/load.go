package config

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/rawbytes"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	k8syaml "sigs.k8s.io/yaml"
)

// EnvKeys maps the supported environment variables onto configuration keys.
// The mapping is explicit because koanf keys are case-sensitive camelCase
// and these names come from the original design notes.
var EnvKeys = map[string]string{
	"CODER_K8S_TEMPLATE_BUILD_WAIT_TIMEOUT":          "aggregatedAPIServer.templateBuildWait.timeout",
	"CODER_K8S_TEMPLATE_BUILD_BACKOFF_AFTER":         "aggregatedAPIServer.templateBuildWait.backoffAfter",
	"CODER_K8S_TEMPLATE_BUILD_INITIAL_POLL_INTERVAL": "aggregatedAPIServer.templateBuildWait.initialPollInterval",
	"CODER_K8S_TEMPLATE_BUILD_MAX_POLL_INTERVAL":     "aggregatedAPIServer.templateBuildWait.maxPollInterval",
}

// changedKeys are keys that still load but whose meaning changed, with
// what they mean now: setting one to other than its default gives a
// warning (Configuration.Warnings). The default itself is fine either way,
// so files written by `config defaults` or the chart stay quiet.
var changedKeys = map[string]changedKey{
	"aggregatedAPIServer.templateBuildWait.timeout": {
		now: "requests no longer wait for template builds " +
			"(they return once the files are uploaded; wait with kubectl wait --for=condition=Ready codertemplate/NAME); " +
			"this now bounds how long a version may build in the background before coder-k8s cancels it and shows the " +
			"template Ready=False reason BuildFailed, and need not fit in requestTimeout",
		isDefault: func(c *Configuration) bool {
			return c.AggregatedAPIServer.TemplateBuildWait.Timeout == Default().AggregatedAPIServer.TemplateBuildWait.Timeout
		},
	},
}

type changedKey struct {
	now       string
	isDefault func(*Configuration) bool
}

// Source says where a configuration comes from besides the built-in
// defaults. Later layers win: defaults < File < Environ < Flags.
type Source struct {
	// File is the configuration file path; empty means no file.
	File string
	// Environ holds KEY=VALUE pairs; nil means os.Environ().
	Environ []string
	// Flags are the command-line flags registered by AddFlags; only flags
	// the user set explicitly override the other layers.
	Flags *pflag.FlagSet
}

// Error lists every problem found in a configuration, each with the field
// path or key it concerns.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	return "invalid configuration:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// Load builds the configuration from the built-in defaults, the file, the
// environment and explicitly set flags, decodes it strictly and validates
// it. It returns an *Error listing every problem when anything is wrong.
func Load(src Source) (*Configuration, error) {
	k := koanf.New(".")
	origin := map[string]string{} // key -> where a non-file value came from

	defaults, err := k8syaml.Marshal(Default())
	if err != nil {
		return nil, fmt.Errorf("render defaults: %w", err)
	}
	if err := k.Load(rawbytes.Provider(defaults), yaml.Parser()); err != nil {
		return nil, fmt.Errorf("load defaults: %w", err)
	}

	var problems []string
	inFile := map[string]bool{} // changed keys the file sets
	if src.File != "" {
		fk := koanf.New(".")
		if err := fk.Load(file.Provider(src.File), yaml.Parser()); err != nil {
			return nil, fmt.Errorf("read config file %s: %w", src.File, err)
		}
		problems = append(problems, checkEnvelope(fk)...)
		for key := range changedKeys {
			inFile[key] = fk.Exists(key)
		}
		if err := k.Merge(fk); err != nil {
			return nil, fmt.Errorf("merge config file %s: %w", src.File, err)
		}
	}

	environ := src.Environ
	if environ == nil {
		environ = os.Environ()
	}
	if err := k.Load(env.Provider(".", env.Opt{
		EnvironFunc: func() []string { return environ },
		TransformFunc: func(name, value string) (string, any) {
			key, ok := EnvKeys[name]
			if !ok {
				return "", nil
			}
			origin[key] = "environment variable " + name
			return key, value
		},
	}), nil); err != nil {
		return nil, fmt.Errorf("load environment: %w", err)
	}

	var sessionToken string
	if src.Flags != nil {
		set := map[string]any{}
		src.Flags.Visit(func(f *pflag.Flag) {
			if f.Name == flagCoderSessionToken {
				sessionToken = f.Value.String()
				return
			}
			if key, ok := flagKeys[f.Name]; ok {
				set[key] = f.Value.String()
				origin[key] = "flag --" + f.Name
			}
		})
		if err := k.Load(confmap.Provider(set, "."), nil); err != nil {
			return nil, fmt.Errorf("load flags: %w", err)
		}
	}

	var cfg Configuration
	if problems = append(problems, checkKeys(k)...); len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	if err := decodeValue(k.Raw(), &cfg); err != nil {
		return nil, fmt.Errorf("decode configuration: %w", err)
	}
	cfg.AggregatedAPIServer.Coder.StaticBackend.SessionToken = sessionToken
	for _, key := range slices.Sorted(maps.Keys(changedKeys)) {
		ck := changedKeys[key]
		where := ""
		if o, ok := origin[key]; ok { // the environment and flags win over the file
			where = "set by " + o
		} else if inFile[key] {
			where = "set in " + src.File
		}
		if where != "" && !ck.isDefault(&cfg) {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("deprecated: %s (%s): %s", key, where, ck.now))
		}
	}

	for _, fe := range Validate(&cfg) {
		msg := fe.Error()
		if o, ok := origin[fe.Field]; ok {
			msg += " (set by " + o + ")"
		}
		problems = append(problems, msg)
	}
	if len(problems) > 0 {
		return nil, &Error{Problems: problems}
	}
	return &cfg, nil
}

// checkEnvelope requires a file to say what it is, so that a file written
// for another program or another version is refused rather than misread.
func checkEnvelope(fk *koanf.Koanf) []string {
	var problems []string
	switch v := fk.Get("apiVersion"); {
	case v == nil:
		problems = append(problems, fmt.Sprintf("apiVersion: Required value: must be %q", APIVersion))
	case v != APIVersion:
		problems = append(problems, fmt.Sprintf("apiVersion: Unsupported value: %v: supported values: %q", v, APIVersion))
	}
	switch v := fk.Get("kind"); {
	case v == nil:
		problems = append(problems, fmt.Sprintf("kind: Required value: must be %q", Kind))
	case v != Kind:
		problems = append(problems, fmt.Sprintf("kind: Unsupported value: %v: supported values: %q", v, Kind))
	}
	return problems
}

// Field is one key of the configuration file: a leaf value or an object
// holding other keys.
type Field struct {
	// Key is the dotted path, for example "aggregatedAPIServer.securePort".
	Key string
	// Type is the Go type of the value.
	Type reflect.Type
	// Struct and Name locate the Go field ("AggregatedAPIServer",
	// "SecurePort"), for documentation.
	Struct, Name string
	// Index is the field's index path in Configuration.
	Index []int
}

// IsObject reports whether the key holds other keys.
func (f Field) IsObject() bool {
	return f.Type.Kind() == reflect.Struct && f.Type != durationType
}

// Fields lists every key of the configuration file in declaration order.
func Fields() []Field {
	var out []Field
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			field := Field{Key: prefix + name, Type: f.Type, Struct: t.Name(), Name: f.Name, Index: append(slices.Clone(index), i)}
			out = append(out, field)
			if field.IsObject() {
				walk(f.Type, field.Key+".", field.Index)
			}
		}
	}
	walk(reflect.TypeOf(Configuration{}), "", nil)
	return out
}

// fieldTypes maps every key onto its Go type.
var fieldTypes = func() map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for _, f := range Fields() {
		m[f.Key] = f.Type
	}
	return m
}()

var durationType = reflect.TypeOf(Duration{})

// checkKeys names every key that is not a configuration field and every
// value of the wrong type, each with its full path, so that all typos are
// found before anything starts.
func checkKeys(k *koanf.Koanf) []string {
	var problems []string
	for _, key := range k.Keys() {
		t, ok := fieldTypes[key]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: unknown field", key))
			continue
		}
		if err := decodeValue(k.Get(key), reflect.New(t).Interface()); err != nil {
			problems = append(problems, fmt.Sprintf("%s: Invalid value: %s: %s", key, quote(k.Get(key)), expected(t)))
		}
	}
	sort.Strings(problems)
	return problems
}

func expected(t reflect.Type) string {
	switch {
	case t == durationType:
		return `must be a duration such as "30s" or "25m"`
	case t.Kind() == reflect.Struct:
		return "must be an object"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		return "must be a list of objects with the keys " + structKeys(t.Elem())
	case t.Kind() == reflect.Slice:
		return "must be a list of strings"
	case t.Kind() == reflect.Bool:
		return "must be true or false"
	case t.Kind() == reflect.Int:
		return "must be an integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "must be a number"
	default:
		return "must be a string"
	}
}

// structKeys lists the configuration keys of a struct type.
func structKeys(t reflect.Type) string {
	var keys []string
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return strings.Join(keys, ", ")
}

func quote(v any) string {
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

// decodeValue decodes strictly: exact key names, no weak typing.
func decodeValue(in, out any) error {
	d, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook: durationHook,
		MatchName:  func(key, field string) bool { return key == field },
		// Keys inside list items (controller.workspaceRBAC.extraNamespaces)
		// are not among koanf's keys: refuse unknown ones here.
		ErrorUnused: true,
		TagName:     "json",
		Result:      out,
	})
	if err != nil {
		return err
	}
	return d.Decode(in)
}

func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	s, ok := data.(string)
	if !ok {
		return nil, fmt.Errorf("expected a duration string such as \"30s\" or \"25m\", got %v", data)
	}
	var d Duration
	if err := d.UnmarshalText([]byte(s)); err != nil {
		return nil, err
	}
	return d, nil
}
