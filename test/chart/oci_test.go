package chart

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

// TestInstallFromOCIRegistry installs the chart the way users get it and
// runs it on the test stack's real node: the image `make image` built and
// the packaged chart are pushed to an OCI registry on loopback
// (go-containerregistry's), then `helm install oci://...` runs into a
// namespace that enforces the restricted Pod Security Standard. The pod
// pulls the image from that registry and becomes Ready, the APIService
// becomes Available through it, and kubectl reads the aggregated API.
func TestInstallFromOCIRegistry(t *testing.T) {
	// The image, as a release pushes it.
	const imageTag = "oci-test"
	on := newOnNode(t, imageTag)
	c, node, idx, pushedImage := on.cluster, on.node, on.idx, on.image
	reg := node.Registry
	host := reg.Host
	ctx := context.Background()
	ref, err := reg.Tag("coder-k8s:" + imageTag)
	if err != nil {
		t.Fatal(err)
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
	h.kubeconfig = c.k.KubeconfigPath
	const ns = "coder-restricted"
	if _, err := c.k.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, stderr, err = h.output("install", releaseName, "oci://"+host+"/charts/coder-k8s", "--version", cur.Metadata.Version, "--plain-http",
		"-n", ns, "--set", "image.registry="+host, "--set", "image.repository=coder-k8s", "--set", "image.tag="+imageTag,
		"--wait", "--timeout", "3m")
	if err != nil {
		t.Fatalf("helm install --wait: %v\n%s%s\n%s", err, out, stderr, podsReport(c, ns))
	}
	t.Logf("helm install --wait took %s", time.Since(start).Round(time.Millisecond))
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
	if img := tmpl.Spec.Containers[0].Image; img != pushedImage {
		t.Errorf("the Deployment runs image %q, want %q (the one pushed)", img, pushedImage)
	}
	// Every pod of the release runs the pushed image on the node and is
	// Ready: PodSecurity admitted it, the kubelet pulled the image from the
	// registry, and its probes pass.
	pods, err := c.k.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(dep.Spec.Selector)})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != int(*dep.Spec.Replicas) {
		t.Fatalf("%d pods, want %d: %s", len(pods.Items), *dep.Spec.Replicas, podsReport(c, ns))
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != node.Name || !podReady(&p) {
			t.Errorf("pod %s on %q, Ready %v; want Ready on %s", p.Name, p.Spec.NodeName, podReady(&p), node.Name)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.ImageID != pushedImageDigest(t, reg, idx) {
				t.Errorf("container %s runs %s, want the pushed image's %s", cs.Name, cs.ImageID, pushedImageDigest(t, reg, idx))
			}
		}
	}
	// The aggregated API, served by the pod: kube-apiserver reaches it at
	// the Service's endpoint, and kubectl lists through it.
	waitAPIServiceAvailable(t, c, "v1alpha1.aggregation.coder.com", time.Minute)
	kubectlOut, kubectlErr, err := c.runKubectl("get", "coderworkspaces", "-A")
	if err != nil || strings.TrimSpace(kubectlErr) != "No resources found" {
		t.Errorf("kubectl get coderworkspaces -A: %v, stdout %q, stderr %q; want no workspaces and no error", err, kubectlOut, kubectlErr)
	}

	// The check is live: the chart's pod without its security context is
	// refused.
	loose := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: releaseName + "-", Namespace: ns, Labels: tmpl.Labels}, Spec: *tmpl.Spec.DeepCopy()}
	loose.Spec.SecurityContext, loose.Spec.Containers[0].SecurityContext = nil, nil
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := c.k.Clientset.CoreV1().Pods(ns).Create(ctx, loose, dryRun); err == nil || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest"`) {
		t.Errorf("a pod without the chart's security context: %v, want refused by PodSecurity", err)
	}
	t.Logf("image %s@%s and chart %s@%s pushed, installed from oci:// and running", pushedImage, want, pushedTo[1], chartDigest[1])
}

// pushedImageDigest is the repository digest containerd reports for the
// pushed index: the image index's own digest, by the name it was pulled
// as.
func pushedImageDigest(t *testing.T, reg *nodeenv.Registry, idx v1.ImageIndex) string {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return reg.Host + "/coder-k8s@" + d.String()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podsReport describes the pods of a namespace and their events, for
// failure messages.
func podsReport(c *cluster, ns string) string {
	out, errOut, _ := c.runKubectl("describe", "pods", "-n", ns)
	return out + errOut
}

// waitAPIServiceAvailable waits until kube-apiserver reports the
// APIService Available (it reached the aggregated server's endpoints) and
// its discovery lists the group version's resources.
func waitAPIServiceAvailable(t *testing.T, c *cluster, name string, timeout time.Duration) {
	t.Helper()
	gvr := apiregistrationv1.SchemeGroupVersion.WithResource("apiservices")
	deadline := time.Now().Add(timeout)
	for {
		u, err := c.dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{})
		var svc apiregistrationv1.APIService
		if err == nil {
			err = kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &svc)
		}
		if err == nil {
			err = fmt.Errorf("conditions %+v", svc.Status.Conditions)
			for _, cond := range svc.Status.Conditions {
				if cond.Type == apiregistrationv1.Available && cond.Status == apiregistrationv1.ConditionTrue {
					err = c.k.WaitForDiscovery(context.Background(), svc.Spec.Group+"/"+svc.Spec.Version, time.Until(deadline))
				}
			}
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("APIService %s not Available after %s: %v", name, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
