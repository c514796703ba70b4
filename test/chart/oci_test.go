package chart

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv"
)

// TestInstallFromOCIRegistry installs the chart the way users get it: the
// image `make image` built and the packaged chart are pushed to an OCI
// registry on loopback (go-containerregistry's), then `helm install
// oci://...` runs into a namespace that enforces the restricted Pod
// Security Standard. The registry serves the image with the binary `make
// build` ships, Helm installs the pushed chart, and kube-apiserver admits
// the Deployment's pods there (the test stack has no node to run them).
func TestInstallFromOCIRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd and helm from bin/, and bin/image from make image")
	}
	idx := shippedImage(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := reg.Listener.Addr().String()
	ctx := context.Background()

	// The image, as a release pushes it.
	const imageTag = "oci-test"
	ref, err := name.NewTag(host+"/coder-k8s:"+imageTag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx)); err != nil {
		t.Fatalf("push the image: %v", err)
	}
	pushed, err := remote.Index(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatalf("pull the image index back: %v", err)
	}
	want, _ := idx.Digest()
	if got, _ := pushed.Digest(); got != want {
		t.Fatalf("the registry serves index %s, pushed %s", got, want)
	}

	// The chart, packaged and pushed as an OCI artifact.
	h := newHelmCLI(t)
	cur := loadChart(t, chartDir(t))
	pkgDir := t.TempDir()
	h.run(t, "package", chartDir(t), "--destination", pkgDir)
	tgz := filepath.Join(pkgDir, "coder-k8s-"+cur.Metadata.Version+".tgz")
	out, stderr, err := h.output("push", tgz, "oci://"+host+"/charts", "--plain-http")
	if err != nil {
		t.Fatalf("helm push: %v\n%s%s", err, out, stderr)
	}
	// helm push reports where the chart went and its digest.
	pushedTo := regexp.MustCompile(`Pushed: (\S+)`).FindStringSubmatch(out + stderr)
	chartDigest := regexp.MustCompile(`Digest: (sha256:[0-9a-f]{64})`).FindStringSubmatch(out + stderr)
	if pushedTo == nil || chartDigest == nil || pushedTo[1] != host+"/charts/coder-k8s:"+cur.Metadata.Version {
		t.Fatalf("helm push output %q, want Pushed: %s/charts/coder-k8s:%s and a digest", out+stderr, host, cur.Metadata.Version)
	}

	// Installed from the registry into a restricted namespace.
	c := newCluster(t)
	h.kubeconfig = c.k.KubeconfigPath
	const ns = "coder-restricted"
	if _, err := c.k.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, stderr, err = h.output("install", releaseName, "oci://"+host+"/charts/coder-k8s", "--version", cur.Metadata.Version, "--plain-http",
		"-n", ns, "--set", "image.registry="+host, "--set", "image.repository=coder-k8s", "--set", "image.tag="+imageTag)
	if err != nil {
		t.Fatalf("helm install: %v\n%s%s", err, out, stderr)
	}
	// Helm reports what it pulled: the chart pushed above.
	if !strings.Contains(stderr, "Pulled: "+pushedTo[1]) || !strings.Contains(stderr, "Digest: "+chartDigest[1]) {
		t.Errorf("helm install pulled %q, want %s@%s", stderr, pushedTo[1], chartDigest[1])
	}
	meta := h.run(t, "get", "metadata", releaseName, "-n", ns, "-o", "json")
	if !strings.Contains(meta, `"chart":"coder-k8s"`) || !strings.Contains(meta, `"version":"`+cur.Metadata.Version+`"`) {
		t.Errorf("helm get metadata: %s, want chart coder-k8s version %s", meta, cur.Metadata.Version)
	}

	dep, err := c.k.Clientset.AppsV1().Deployments(ns).Get(ctx, releaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := dep.Spec.Template
	if img := tmpl.Spec.Containers[0].Image; img != ref.String() {
		t.Errorf("the Deployment runs image %q, want %q (the one pushed)", img, ref)
	}
	// The pod as the ReplicaSet controller would create it: kube-apiserver's
	// PodSecurity admission judges it against the namespace's level.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: releaseName + "-", Namespace: ns, Labels: tmpl.Labels}, Spec: tmpl.Spec}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := c.k.Clientset.CoreV1().Pods(ns).Create(ctx, pod, dryRun); err != nil {
		t.Errorf("the chart's pod is refused in a namespace enforcing restricted: %v", err)
	}
	// The check is live: the same pod without its security context is refused.
	loose := pod.DeepCopy()
	loose.Spec.SecurityContext, loose.Spec.Containers[0].SecurityContext = nil, nil
	if _, err := c.k.Clientset.CoreV1().Pods(ns).Create(ctx, loose, dryRun); err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Errorf("a pod without the chart's security context: %v, want refused by PodSecurity", err)
	}
	t.Logf("image %s@%s and chart %s@%s pushed and installed from oci://", ref, want, pushedTo[1], chartDigest[1])
}

// shippedImage is the image in bin/image (`make image`) holding, for this
// machine's platform, the binary `make build` ships from the sources as
// they are.
func shippedImage(t *testing.T) v1.ImageIndex {
	t.Helper()
	dir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := testenv.ShippedBinary()
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(filepath.Join(dir, "image"))
	if errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s not found: run `make image` (make test builds it)", filepath.Join(dir, "image"))
	}
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("bin/image: %v, %d entries, want the one `make image` writes", err, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Platform == nil || d.Platform.OS != runtime.GOOS || d.Platform.Architecture != runtime.GOARCH {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		inImage := fileInImage(t, img, "coder-k8s")
		shipped, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(inImage, shipped) {
			t.Fatalf("bin/image's /coder-k8s (%d bytes) is not %s (%d bytes): run `make image`", len(inImage), bin, len(shipped))
		}
		return idx
	}
	t.Fatalf("bin/image has no image for %s/%s: run `make image`", runtime.GOOS, runtime.GOARCH)
	return nil
}

// fileInImage returns the content of path in img's file system.
func fileInImage(t *testing.T, img v1.Image, path string) []byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("the image has no %s", path)
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimPrefix(h.Name, "/") == path {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
