package v1alpha1_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/testenv"
)

// kubectl runs the pinned kubectl against k and returns its combined output.
func kubectl(t *testing.T, k *testenv.KubeAPI, stdin string, args ...string) (string, error) {
	t.Helper()
	bin, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(k.KubectlFlags(), args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// What a user sees of the CRDs through a real kube-apiserver.
func TestCRDs(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("samples apply", func(t *testing.T) {
		out, err := kubectl(t, k, "", "apply", "-f", filepath.Join(root, "config", "samples"))
		if err != nil {
			t.Fatalf("kubectl apply -f config/samples: %v\n%s", err, out)
		}
	})

	t.Run("printer columns, short names and the coder category", func(t *testing.T) {
		for _, tc := range []struct{ resource, header string }{
			{"ccp", "NAME             PHASE   URL   READY   ACCESS   AGE"},
			{"cprov", "NAME                PHASE   CONTROL PLANE   READY   AGE"},
			{"cwp", "NAME      PHASE   CONTROL PLANE   URL   READY   AGE"},
		} {
			out, err := kubectl(t, k, "", "get", tc.resource)
			if err != nil {
				t.Fatalf("kubectl get %s: %v\n%s", tc.resource, err, out)
			}
			if first, _, _ := strings.Cut(out, "\n"); strings.Join(strings.Fields(first), " ") != strings.Join(strings.Fields(tc.header), " ") {
				t.Errorf("kubectl get %s header = %q, want columns %q", tc.resource, first, tc.header)
			}
		}
		out, err := kubectl(t, k, "", "get", "coder", "-o", "name")
		if err != nil {
			t.Fatalf("kubectl get coder: %v\n%s", err, out)
		}
		for _, want := range []string{
			"codercontrolplane.coder.com/coder", "codercontrolplane.coder.com/coder-external",
			"coderprovisioner.coder.com/coder-provisioner", "coderworkspaceproxy.coder.com/eu-west",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl get coder lacks %s:\n%s", want, out)
			}
		}
	})

	t.Run("defaults are applied by kube-apiserver", func(t *testing.T) {
		out, err := kubectl(t, k, "", "get", "ccp", "coder", "-o",
			"jsonpath={.spec.service.type} {.spec.serviceAccount.create} {.spec.workspaceRBAC.enabled} {.spec.operatorAccess.tokenLifetime}")
		if err != nil || out != "ClusterIP true true 168h" {
			t.Errorf("defaults = %q (%v), want %q", out, err, "ClusterIP true true 168h")
		}
		out, err = kubectl(t, k, "", "get", "cprov", "coder-provisioner", "-o", "jsonpath={.spec.organization}")
		if err != nil || out != "coder" {
			t.Errorf("provisioner organization default = %q (%v), want coder", out, err)
		}
	})

	invalid := []struct {
		name, manifest string
		want           []string
	}{{
		name: "externalURL with image",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: both}
spec: {externalURL: "https://coder.example.com", image: "ghcr.io/coder/coder:v2.30.0"}`,
		want: []string{"spec: Invalid value", "externalURL adopts an existing coderd"},
	}, {
		name: "ingress and httpRoute",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: exposed-twice}
spec:
  expose:
    ingress: {host: coder.example.com}
    httpRoute: {parentRefs: [{name: gw}]}`,
		want: []string{"spec.expose", "either ingress or httpRoute, not both"},
	}, {
		name: "owner token and owner credentials",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: two-owners}
spec:
  operatorAccess:
    ownerTokenSecretRef: {name: t, key: token}
    ownerCredentialsSecretRef: {name: c}`,
		want: []string{"spec.operatorAccess", "either ownerTokenSecretRef or ownerCredentialsSecretRef"},
	}, {
		name: "relative external URL",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: relative}
spec: {externalURL: "coder.example.com"}`,
		want: []string{"spec.externalURL", "should match"},
	}, {
		name: "negative replicas and unknown service type",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: negative}
spec: {replicas: -1, service: {type: Magic}}`,
		want: []string{"spec.replicas", "spec.service.type", `Unsupported value: "Magic"`},
	}, {
		name: "a name that cannot name a Service",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata: {name: 1coder}
spec: {}`,
		want: []string{"metadata.name must be a DNS-1035 label"},
	}, {
		name: "provisioner without a control plane",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderProvisioner
metadata: {name: orphan}
spec: {}`,
		want: []string{"spec.controlPlaneRef", "Required value"},
	}, {
		name: "workspace proxy without an access URL",
		manifest: `apiVersion: coder.com/v1alpha1
kind: CoderWorkspaceProxy
metadata: {name: nowhere}
spec: {controlPlaneRef: {name: coder}}`,
		want: []string{"spec.accessURL", "Required value"},
	}}
	for _, tc := range invalid {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			out, err := kubectl(t, k, tc.manifest, "apply", "-f", "-")
			if err == nil {
				t.Fatalf("kube-apiserver accepted an invalid object:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("error lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
