// The parsed `helm template` output every render test reads: its objects,
// strictly decoded, and the config file the ConfigMap carries.

package chart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/config"
)

// The strict decoder for every kind the chart renders that client-go,
// apiextensions and kube-aggregator know: a misspelt field in a template
// is a decoding error, as it would be for kubectl --validate=strict.
var strictDecoder = func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, apiregistrationv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}()

// object is one document of a rendered manifest.
type object struct {
	// source is the template it came from ("coder-k8s/templates/...").
	source string
	// yaml is the document as rendered.
	yaml string
	u    *unstructured.Unstructured
	// typed is the strictly decoded object; nil for kinds outside the
	// scheme (ServiceMonitor, cert-manager's).
	typed runtime.Object
}

func (o *object) String() string {
	if o.u.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", o.u.GetKind(), o.u.GetNamespace(), o.u.GetName())
	}
	return fmt.Sprintf("%s %s", o.u.GetKind(), o.u.GetName())
}

// manifest is a parsed `helm template` output.
type manifest struct {
	text    string
	objects []*object
}

// parseManifest parses every document strictly (duplicate keys are
// errors) and fails the test on anything that is not a Kubernetes object.
func parseManifest(t testing.TB, text string) *manifest {
	t.Helper()
	m := &manifest{text: text}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(text)))
	seen := map[string]string{}
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		source := ""
		for _, line := range strings.Split(string(doc), "\n") {
			if s, ok := strings.CutPrefix(line, "# Source: "); ok {
				source = s
				break
			}
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("document %d (%s) is not valid YAML: %v\n%s", i, source, err, doc)
		}
		if string(bytes.TrimSpace(js)) == "null" {
			if strings.TrimSpace(string(doc)) != "" && strings.TrimSpace(string(doc)) != "---" {
				t.Errorf("document %d (%s) holds no object, only:\n%s", i, source, doc)
			}
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("document %d (%s) is not a Kubernetes object: %v\n%s", i, source, err, doc)
		}
		o := &object{source: source, yaml: string(doc), u: u}
		if u.GetName() == "" {
			t.Errorf("%s (%s) has no metadata.name", u.GetKind(), source)
		}
		typed, _, err := strictDecoder.Decode(js, nil, nil)
		switch {
		case runtime.IsNotRegisteredError(err):
		case err != nil:
			t.Errorf("%s (%s) does not decode strictly: %v", o, source, err)
		default:
			o.typed = typed
		}
		key := u.GroupVersionKind().GroupKind().String() + " " + u.GetNamespace() + "/" + u.GetName()
		if prev, dup := seen[key]; dup {
			t.Errorf("%s rendered twice, by %s and %s", o, prev, source)
		}
		seen[key] = source
		m.objects = append(m.objects, o)
	}
	if len(m.objects) == 0 {
		t.Fatal("the manifest holds no objects")
	}
	return m
}

// all returns the objects of a kind.
func (m *manifest) all(kind string) []*object {
	var out []*object
	for _, o := range m.objects {
		if o.u.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// find returns the object of a kind and name, or nil.
func (m *manifest) find(kind, name string) *object {
	for _, o := range m.all(kind) {
		if o.u.GetName() == name {
			return o
		}
	}
	return nil
}

// kinds lists the distinct kinds, sorted.
func (m *manifest) kinds() []string {
	set := map[string]bool{}
	for _, o := range m.objects {
		set[o.u.GetKind()] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// typedAll returns the strictly decoded objects of a kind.
func typedAll[T runtime.Object](t testing.TB, m *manifest, kind string) []T {
	t.Helper()
	var out []T
	for _, o := range m.all(kind) {
		v, ok := o.typed.(T)
		if !ok {
			t.Fatalf("%s decoded as %T", o, o.typed)
		}
		out = append(out, v)
	}
	return out
}

// one returns the single object of a kind, failing otherwise.
func one[T runtime.Object](t testing.TB, m *manifest, kind string) T {
	t.Helper()
	all := typedAll[T](t, m, kind)
	if len(all) != 1 {
		t.Fatalf("want exactly one %s, got %d", kind, len(all))
	}
	return all[0]
}

// deployment returns the chart's one Deployment and its one container.
func deployment(t testing.TB, m *manifest) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := one[*appsv1.Deployment](t, m, "Deployment")
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("Deployment %s has %d containers, want 1", d.Name, n)
	}
	return d, &d.Spec.Template.Spec.Containers[0]
}

// configFile returns config.yaml of the chart's ConfigMap, as mounted.
func configFile(t testing.TB, m *manifest) string {
	t.Helper()
	cm := one[*corev1.ConfigMap](t, m, "ConfigMap")
	data, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no config.yaml (keys %v)", cm.Name, slices.Sorted(maps.Keys(cm.Data)))
	}
	return data
}

// loadConfig loads a rendered config file with the binary's own loader:
// the same strict decoding (unknown keys and wrong types are errors) and
// validation `coder-k8s --config` applies at start. The environment is
// left out so that the test's own cannot change the result.
func loadConfig(t testing.TB, data string) *config.Configuration {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(config.Source{File: path, Environ: []string{}})
	if err != nil {
		t.Fatalf("the rendered config file does not load: %v\n%s", err, data)
	}
	return cfg
}
