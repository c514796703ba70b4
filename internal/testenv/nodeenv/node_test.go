package nodeenv

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coder/coder-k8s/internal/testenv"
)

// TestNode runs pods on the test stack's real node: a pod of the shipped
// binary's image runs to completion as the image's user, its log comes
// back through kube-apiserver and the kubelet, and stopping the node and
// the stack leaves no process, network namespace or mount behind.
func TestNode(t *testing.T) {
	network := NewNetwork(t)
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{Node: network.Serving()})
	netns := network.Netns
	start := time.Now()
	n := NewNode(t, k, network)
	t.Logf("node Ready in %s", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()

	node, err := k.Clientset.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := node.Status.NodeInfo.KubeletVersion; v != serverVersion(t, k) {
		t.Errorf("the kubelet is %s, kube-apiserver %s: make tools builds both from one module", v, serverVersion(t, k))
	}
	if rt := node.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rt, "containerd://1.") {
		t.Errorf("container runtime %q, want containerd", rt)
	}

	shipped, err := testenv.ShippedBinary()
	if err != nil {
		t.Fatal(err)
	}
	img, err := binaryImage(shipped, "coder-k8s", 65532)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := n.Registry.PushImage(ctx, "coder-k8s:node-test", img)
	if err != nil {
		t.Fatal(err)
	}
	want, err := exec.Command(shipped, "version").Output()
	if err != nil {
		t.Fatal(err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "version", Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
			Containers: []corev1.Container{{
				Name: "coder-k8s", Image: ref, Args: []string{"version"},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
	if err := k.EnsureNamespace(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount admission plugin needs the namespace's default
	// ServiceAccount, which kube-controller-manager creates.
	testenv.WaitFor(t, time.Minute, func() error {
		_, err := k.Clientset.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if _, err := k.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	testenv.WaitFor(t, 2*time.Minute, func() error {
		got, err = k.Clientset.CoreV1().Pods("default").Get(ctx, "version", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s: %+v; %s", got.Status.Phase, got.Status.ContainerStatuses, podEvents(k, "default", "version"))
		}
		return nil
	})
	if got.Spec.NodeName != NodeName {
		t.Errorf("the pod ran on %q, want %q (scheduled by kube-scheduler)", got.Spec.NodeName, NodeName)
	}
	if ip := got.Status.PodIP; !podIPIn(ip, network.PodCIDR) {
		t.Errorf("pod IP %q, want one in the node's pod subnet %s", ip, network.PodCIDR)
	}
	logs, err := k.Clientset.CoreV1().Pods("default").GetLogs("version", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs through kube-apiserver and the kubelet: %v", err)
	}
	if string(logs) != string(want) {
		t.Errorf("the pod logged %q, want %q (the shipped binary's version)", logs, want)
	}

	// Stopping the node takes down its containers and their networks.
	nsID, err := os.Stat(testenv.NetnsPath(netns))
	if err != nil {
		t.Fatalf("no network namespace %s: %v", netns, err)
	}
	n.Stop()
	if left := processesInNetns(nsID); len(left) > 0 {
		t.Errorf("processes left in the node's network namespace after Stop: %v", left)
	}
	if pods := testenv.PodNetns(context.Background(), netns); len(pods) > 0 {
		t.Errorf("pod network namespaces left after Stop: %v", pods)
	}
	k.Stop()
	network.Remove()
	if _, err := os.Stat(testenv.NetnsPath(netns)); !os.IsNotExist(err) {
		t.Errorf("the node's network namespace is still there after Network.Remove: %v", err)
	}
}

// TestNodeSweptAfterKill kills a test process that runs a node with a pod
// (SIGKILL: no cleanup runs) and checks that the next run's Sweep, in a
// new process, stops the containers and removes the network namespaces,
// the route to the pods and the files.
func TestNodeSweptAfterKill(t *testing.T) {
	switch os.Getenv("TESTENV_NODE_CHILD") {
	case "node":
		nodeChild(t)
		return
	case "sweep":
		testenv.Sweep()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeSweptAfterKill$", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "TESTENV_NODE_CHILD=node")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var netns, dir, podCIDR string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "NODE %s %s %s", &netns, &dir, &podCIDR); err == nil {
			break
		}
	}
	if netns == "" {
		t.Fatal("the child process did not start its node")
	}
	ids := []os.FileInfo{}
	for _, ns := range append([]string{netns}, testenv.PodNetns(context.Background(), netns)...) {
		id, err := os.Stat(testenv.NetnsPath(ns))
		if err != nil {
			t.Fatalf("no network namespace %s: %v", ns, err)
		}
		ids = append(ids, id)
	}
	if len(ids) < 2 {
		t.Fatalf("the child's node has no pod network namespace")
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
	for _, id := range ids {
		if len(processesInNetns(id)) == 0 {
			t.Fatalf("nothing survived the kill, so the sweep is not tested")
		}
	}

	sweeper := exec.Command(os.Args[0], "-test.run=^TestNodeSweptAfterKill$", "-test.timeout=5m")
	sweeper.Env = append(os.Environ(), "TESTENV_NODE_CHILD=sweep")
	if out, err := sweeper.CombinedOutput(); err != nil {
		t.Fatalf("sweep: %v\n%s", err, out)
	}
	for _, id := range ids {
		if left := processesInNetns(id); len(left) > 0 {
			t.Errorf("processes left after the sweep: %v", left)
		}
	}
	if _, err := os.Stat(testenv.NetnsPath(netns)); !os.IsNotExist(err) {
		t.Errorf("the node's network namespace is still there: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the node's directory is still there: %v", err)
	}
	if routes, _ := testenv.RunOutput(context.Background(), "ip", "route", "show", podCIDR); strings.TrimSpace(routes) != "" {
		t.Errorf("the route to the pods is still there: %s", routes)
	}
}

// nodeChild starts a node with a running pod, reports it and waits to be
// killed.
func nodeChild(t *testing.T) {
	network, err := StartNetwork(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	k, err := testenv.StartKubeAPI(t.Context(), testenv.KubeAPIOptions{Node: network.Serving()})
	if err != nil {
		t.Fatal(err)
	}
	n, err := StartNode(t.Context(), k, network)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := k.EnsureNamespace(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: "default"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "pause", Image: n.PauseImage}},
		},
	}
	testenv.WaitFor(t, time.Minute, func() error {
		_, err := k.Clientset.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if _, err := k.Clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 2*time.Minute, func() error {
		p, err := k.Clientset.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
	fmt.Printf("NODE %s %s %s\n", network.Netns, filepath.Dir(k.Dir), network.PodCIDR)
	select {}
}

// podEvents lists the events about a pod, for failure messages.
func podEvents(k *testenv.KubeAPI, namespace, name string) string {
	evs, err := k.Clientset.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return fmt.Sprintf("events: %v", err)
	}
	out := "events:"
	for _, e := range evs.Items {
		out += fmt.Sprintf("\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return out
}

// processesInNetns lists the PIDs of running processes in network
// namespace id (its file's information).
func processesInNetns(id os.FileInfo) []string {
	var pids []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if got, err := os.Stat(filepath.Join(p, "ns", "net")); err == nil && os.SameFile(got, id) {
			if stat, _ := os.ReadFile(filepath.Join(p, "stat")); !strings.Contains(string(stat), ") Z ") {
				pids = append(pids, filepath.Base(p))
			}
		}
	}
	return pids
}

func podIPIn(ip, cidr string) bool {
	prefix := strings.TrimSuffix(cidr, "0/24")
	return strings.HasPrefix(ip, prefix)
}

func serverVersion(t *testing.T, k *testenv.KubeAPI) string {
	t.Helper()
	v, err := k.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	return v.GitVersion
}
