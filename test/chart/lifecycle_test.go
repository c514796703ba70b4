package chart

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/coder/coder-k8s/internal/testenv"
)

// TestPodLifecycle runs the chart's high-availability values (two
// replicas, a PodDisruptionBudget) on the test stack's real node and
// checks what users rely on while pods come and go: a `helm upgrade` rolls
// the Deployment while a client of the aggregated API (through
// kube-apiserver) and a client of the MCP Service (through kube-proxy)
// each poll every 100 ms with no failed request; deleting the leader pod
// hands the Lease to the other replica within the lease duration, again
// with no failed request; and `helm uninstall` leaves what the README
// says it leaves.
func TestPodLifecycle(t *testing.T) {
	const imageTag = "lifecycle"
	on := newOnNode(t, imageTag)
	c, node, ctx := on.cluster, on.node, t.Context()
	h := newHelmCLI(t)
	h.kubeconfig = c.k.KubeconfigPath
	const ns = "coder-system"
	values := []string{"-n", ns, "-f", filepath.Join(chartDir(t), "ci", "ha-values.yaml"),
		"--set", "image.registry=" + node.Registry.Host, "--set", "image.repository=coder-k8s", "--set", "image.tag=" + imageTag,
		"--wait", "--timeout", "3m"}
	if out, stderr, err := h.output(append([]string{"install", releaseName, chartDir(t), "--create-namespace"}, values...)...); err != nil {
		t.Fatalf("helm install: %v\n%s%s\n%s", err, out, stderr, podsReport(c, ns))
	}
	waitAPIServiceAvailable(t, c, "v1alpha1.aggregation.coder.com", time.Minute)
	first := releasePods(t, c, ns)
	if len(first) != 2 {
		t.Fatalf("%d pods after install, want the 2 replicas of ha-values.yaml", len(first))
	}

	p := startPollers(t, c, ns)

	// The pods' logs to their end, for failure messages: pods and their
	// logs go away with a delete.
	logs := followLogs(t, c, ns, first)
	step(t, "helm upgrade rolls the Deployment with no failed request", func(t *testing.T) {
		before := p.snapshot()
		start := time.Now()
		if out, stderr, err := h.output(append([]string{"upgrade", releaseName, chartDir(t), "--set-string", "podAnnotations.rollout=2"}, values...)...); err != nil {
			t.Fatalf("helm upgrade: %v\n%s%s\n%s", err, out, stderr, podsReport(c, ns))
		}
		// helm --wait returns once the new pods are Ready; the old ones
		// may still be terminating (and serving their last requests).
		testenv.WaitFor(t, time.Minute, func() error {
			for name := range first {
				if _, err := c.k.Clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("old pod %s still exists (%v)", name, err)
				}
			}
			if pods := releasePods(t, c, ns); len(pods) != 2 {
				return fmt.Errorf("%d pods, want 2", len(pods))
			}
			return nil
		})
		time.Sleep(2 * time.Second)
		p.check(t, before, "the roll", time.Since(start))
	})

	step(t, "deleting the leader pod hands the Lease over within the lease duration", func(t *testing.T) {
		leases := c.k.Clientset.CoordinationV1().Leases(ns)
		lease, err := leases.Get(ctx, releaseName+"-leader", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The roll's last old pod released the Lease as it stopped (a
		// released Lease says 1 s); a new pod takes it at its next retry,
		// within the chart's lease duration (15 s).
		var holder, leader string
		testenv.WaitFor(t, 15*time.Second, func() error {
			if lease, err = leases.Get(ctx, lease.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			holder = ptr.Deref(lease.Spec.HolderIdentity, "")
			pods := releasePods(t, c, ns)
			if leader, _, _ = strings.Cut(holder, "_"); !pods[leader] {
				return fmt.Errorf("the Lease is held by %q, not by a pod of the release (%v); replaced pods' logs:\n%s", holder, pods, logs())
			}
			return nil
		})
		// The duration its holder wrote.
		duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
		before := p.snapshot()
		start := time.Now()
		if err := c.k.Clientset.CoreV1().Pods(ns).Delete(ctx, leader, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var handedTo string
		var live map[string]bool
		testenv.WaitFor(t, 2*duration, func() error {
			l, err := leases.Get(ctx, lease.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			if h == "" || h == holder {
				return fmt.Errorf("the Lease is held by %q", h)
			}
			handedTo = h
			live = releasePods(t, c, ns)
			return nil
		})
		took := time.Since(start)
		// The other replica, or the one the ReplicaSet started meanwhile.
		next, _, _ := strings.Cut(handedTo, "_")
		if _, ok := live[next]; !ok || next == leader {
			t.Errorf("the Lease went to %q, want another running replica (%v)", handedTo, live)
		}
		if took > duration {
			t.Errorf("the Lease was handed over %s after the leader pod's deletion, want within the lease duration %s", took, duration)
		}
		t.Logf("Lease handed from %s to %s %s after the delete", leader, next, took.Round(time.Millisecond))
		// The ReplicaSet replaces the pod; wait until both replicas serve.
		testenv.WaitFor(t, 2*time.Minute, func() error {
			pods := releasePods(t, c, ns)
			if _, ok := pods[leader]; ok || len(pods) != 2 {
				return fmt.Errorf("pods %v", pods)
			}
			for name, ready := range pods {
				if !ready {
					return fmt.Errorf("pod %s not Ready", name)
				}
			}
			return nil
		})
		time.Sleep(time.Second)
		p.check(t, before, "the leader's deletion", time.Since(start))
	})
	p.stop()

	step(t, "helm uninstall leaves what the README says it leaves", func(t *testing.T) {
		if out, stderr, err := h.output("uninstall", releaseName, "-n", ns, "--wait", "--timeout", "2m"); err != nil {
			t.Fatalf("helm uninstall: %v\n%s%s", err, out, stderr)
		}
		// The pods go after the Deployment, through the garbage collector
		// and their shutdown delay.
		testenv.WaitFor(t, time.Minute, func() error {
			pods, err := c.k.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil && len(pods.Items) > 0 {
				err = fmt.Errorf("%d pods left", len(pods.Items))
			}
			return err
		})
		left := leftovers(t, c, ns)
		// As the README says: the CRDs (crds.keep), and what coder-k8s
		// wrote itself at run time: the leader Lease and the auto-TLS CA.
		want := []string{
			"CustomResourceDefinition codercontrolplanes.coder.com",
			"CustomResourceDefinition coderobjectrecords.coder.com",
			"CustomResourceDefinition coderprovisioners.coder.com",
			"CustomResourceDefinition coderworkspaceproxies.coder.com",
			"Secret " + ns + "/" + releaseName + "-aggregated-tls",
			"Lease " + ns + "/" + releaseName + "-leader",
		}
		if strings.Join(left, "\n") != strings.Join(want, "\n") {
			t.Errorf("after helm uninstall:\n%s\nwant only:\n%s", strings.Join(left, "\n"), strings.Join(want, "\n"))
		}
	})
}

// followLogs streams the logs of pods until they end; the function returned
// gives what arrived so far.
func followLogs(t *testing.T, c *cluster, ns string, pods map[string]bool) func() string {
	var mu sync.Mutex
	bufs := map[string]*bytes.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for name := range pods {
		buf := &bytes.Buffer{}
		bufs[name] = buf
		wg.Go(func() {
			rc, err := c.k.Clientset.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
			if err != nil {
				mu.Lock()
				fmt.Fprintf(buf, "(logs: %v)", err)
				mu.Unlock()
				return
			}
			defer rc.Close()
			chunk := make([]byte, 32<<10)
			for {
				n, err := rc.Read(chunk)
				mu.Lock()
				buf.Write(chunk[:n])
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		var out strings.Builder
		for name, buf := range bufs {
			fmt.Fprintf(&out, "--- %s\n%s\n", name, buf.String())
		}
		return out.String()
	}
}

// releasePods maps the names of the release's pods that are not being
// deleted to whether they are Ready.
func releasePods(t *testing.T, c *cluster, ns string) map[string]bool {
	t.Helper()
	pods, err := c.k.Clientset.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + releaseName})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out[p.Name] = podReady(&p)
		}
	}
	return out
}

// leftovers lists what exists after an uninstall that the release or
// coder-k8s made: CRDs of coder.com and aggregation.coder.com's
// APIService, cluster roles and bindings, webhooks and admission
// policies mentioning coder-k8s, and every object in ns but the defaults
// Kubernetes itself puts in a namespace.
func leftovers(t *testing.T, c *cluster, ns string) []string {
	t.Helper()
	var left []string
	add := func(kind, name string) { left = append(left, kind+" "+name) }
	for _, o := range c.apiObjects(t, "apiextensions.k8s.io/v1", "customresourcedefinitions", "") {
		if strings.HasSuffix(o, ".coder.com") {
			add("CustomResourceDefinition", o)
		}
	}
	for _, o := range c.apiObjects(t, "apiregistration.k8s.io/v1", "apiservices", "") {
		if strings.HasSuffix(o, ".aggregation.coder.com") {
			add("APIService", o)
		}
	}
	for _, r := range []struct{ gv, resource, kind string }{
		{"rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole"},
		{"rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding"},
		{"admissionregistration.k8s.io/v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy"},
		{"admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"},
	} {
		for _, o := range c.apiObjects(t, r.gv, r.resource, "") {
			if strings.Contains(o, "coder") {
				add(r.kind, o)
			}
		}
	}
	for _, r := range []struct{ gv, resource, kind string }{
		{"v1", "pods", "Pod"}, {"v1", "services", "Service"}, {"v1", "secrets", "Secret"},
		{"v1", "configmaps", "ConfigMap"}, {"v1", "serviceaccounts", "ServiceAccount"},
		{"apps/v1", "deployments", "Deployment"}, {"apps/v1", "replicasets", "ReplicaSet"},
		{"policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"},
		{"coordination.k8s.io/v1", "leases", "Lease"},
		{"rbac.authorization.k8s.io/v1", "roles", "Role"}, {"rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding"},
		{"networking.k8s.io/v1", "networkpolicies", "NetworkPolicy"},
	} {
		for _, o := range c.apiObjects(t, r.gv, r.resource, ns) {
			// What every namespace has, and the pollers' identity.
			if o == "kube-root-ca.crt" || o == "default" || strings.HasPrefix(o, "poller") {
				continue
			}
			add(r.kind, ns+"/"+o)
		}
	}
	return left
}

// apiObjects lists the names of resource's objects (in ns, or cluster
// wide when ns is empty).
func (c *cluster) apiObjects(t *testing.T, gv, resource, ns string) []string {
	t.Helper()
	path := "/apis/" + gv
	if gv == "v1" {
		path = "/api/v1"
	}
	if ns != "" {
		path += "/namespaces/" + ns
	}
	var list metav1.PartialObjectMetadataList
	err := c.k.Clientset.Discovery().RESTClient().Get().AbsPath(path, resource).
		SetHeader("Accept", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1").Do(context.Background()).Into(&list)
	if err != nil {
		t.Fatalf("list %s: %v", path+"/"+resource, err)
	}
	var names []string
	for _, o := range list.Items {
		names = append(names, o.Name)
	}
	return names
}

// pollers are a client of the aggregated API (through kube-apiserver) and
// a client of the MCP Service (through its ClusterIP, as a pod reaches
// it), each sending a request every 100 ms as a ServiceAccount bound to
// the view role in the release's namespace.
type pollers struct {
	stop func()

	mu       sync.Mutex
	ok       map[string]int
	failures map[string][]string
}

func startPollers(t *testing.T, c *cluster, ns string) *pollers {
	t.Helper()
	ctx := context.Background()
	cs := c.k.Clientset
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "poller"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "poller-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "poller", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "poller", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token
	svc, err := cs.CoreV1().Services(ns).Get(ctx, releaseName+"-mcp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mcpURL := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))) + "/mcp"

	cfg := rest.AnonymousClientConfig(c.k.Config)
	cfg.BearerToken = token
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mcpClient := &http.Client{Timeout: 10 * time.Second}
	polls := map[string]func(context.Context) error{
		"aggregated API LIST": func(ctx context.Context) error {
			body, err := kc.Discovery().RESTClient().Get().AbsPath("/apis/aggregation.coder.com/v1alpha1/namespaces", ns, "coderworkspaces").DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("%w: %.300s", err, body)
			}
			return nil
		},
		"MCP tools/list": func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, mcpURL,
				strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := mcpClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"tools"`)) {
				return fmt.Errorf("%s: %.200s", resp.Status, body)
			}
			return nil
		},
	}
	p := &pollers{ok: map[string]int{}, failures: map[string][]string{}}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for name, poll := range polls {
		// Each must work before the lifecycle starts: kube-proxy programs
		// a new Service's address asynchronously.
		start := time.Now()
		testenv.WaitFor(t, time.Minute, func() error {
			rctx, done := context.WithTimeout(ctx, 2*time.Second)
			defer done()
			return poll(rctx)
		})
		t.Logf("%s answered %s after the install", name, time.Since(start).Round(time.Millisecond))
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case at := <-tick.C:
					rctx, done := context.WithTimeout(pctx, 10*time.Second)
					err := poll(rctx)
					done()
					if pctx.Err() != nil {
						return
					}
					p.mu.Lock()
					if err != nil {
						p.failures[name] = append(p.failures[name], at.Format("15:04:05.000")+" "+err.Error())
					} else {
						p.ok[name]++
					}
					p.mu.Unlock()
				}
			}
		})
	}
	p.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(p.stop)
	return p
}

// pollCounts is what the pollers saw up to a moment.
type pollCounts struct {
	ok       map[string]int
	failures map[string]int
}

func (p *pollers) snapshot() pollCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := pollCounts{ok: map[string]int{}, failures: map[string]int{}}
	for k, v := range p.ok {
		s.ok[k] = v
	}
	for k, v := range p.failures {
		s.failures[k] = len(v)
	}
	return s
}

// check fails the test for any request that failed since before, and
// when a poller made less than half the requests its period allows.
func (p *pollers) check(t *testing.T, before pollCounts, during string, took time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, n := range p.ok {
		ok := n - before.ok[name]
		failed := p.failures[name][before.failures[name]:]
		t.Logf("%s during %s (%s): %d requests succeeded, %d failed", name, during, took.Round(time.Millisecond), ok, len(failed))
		if len(failed) > 0 {
			t.Errorf("%s: %d requests failed during %s:\n%s", name, len(failed), during, strings.Join(failed, "\n"))
		}
		if min := int(took / (200 * time.Millisecond)); ok < min {
			t.Errorf("%s: only %d requests in %s, want at least %d", name, ok, took, min)
		}
	}
}
