package nodeenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv"
)

// NodeName is the name the test node registers under.
const NodeName = "coder-k8s-node"

// nodeStartTimeout bounds the wait for the node to become Ready.
const nodeStartTimeout = 2 * time.Minute

// cniPlugins are the CNI plugins the node's network configuration uses,
// built into bin/cni by make tools.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// Node is a real Kubernetes node for a KubeAPI serving its Network (see
// StartNetwork): the kubelet, containerd (with runc, from Debian),
// kube-proxy and a CNI bridge run in the node's own network namespace;
// kube-scheduler and kube-controller-manager run beside kube-apiserver. Its images come from Registry, which the node
// reaches as a mirror of the registry's loopback name.
type Node struct {
	Name     string
	Registry *Registry
	// PauseImage is the sandbox image, in Registry.
	PauseImage string

	// Network is the node's network, which the node does not own.
	Network *Network

	k     *testenv.KubeAPI
	dir   string
	procs []*testenv.Process // in start order
}

// nodeFreeSpace is the free space a node needs to start: its containerd
// holds each image pulled twice (the compressed layers and the unpacked
// snapshot), and several nodes run at once in make test.
const nodeFreeSpace = 2 << 30

// StartNode starts a node on network for k, which must serve that network
// (KubeAPIOptions.Node set to network.Serving()), and waits until it is
// Ready.
func StartNode(ctx context.Context, k *testenv.KubeAPI, network *Network) (n *Node, err error) {
	testenv.Sweep()
	if network == nil {
		return nil, errors.New("start node: no node network")
	}
	bins := map[string]string{}
	for _, name := range []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager", "coredns", "pause"} {
		if bins[name], err = testenv.Binary(name); err != nil {
			return nil, err
		}
	}
	for _, name := range cniPlugins {
		if _, err := testenv.Binary(filepath.Join("cni", name)); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"containerd", "containerd-shim-runc-v2", "runc", "iptables"} {
		if bins[name], err = exec.LookPath(name); err != nil {
			return nil, fmt.Errorf("%s not found: run `make tools` (it installs containerd, runc and iptables from Debian)", name)
		}
	}
	if err := testenv.RequireFreeSpace(k.Dir, nodeFreeSpace, "a node (containerd unpacks its images there)"); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	// Sweep finds a killed run's node directory there (kube-*/node-*).
	dir, err := os.MkdirTemp(k.Dir, "node-")
	if err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	n = &Node{Name: NodeName, Network: network, k: k, dir: dir}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if n.Registry, err = StartRegistry(network.HostIP); err != nil {
		return nil, err
	}
	pause, err := binaryImage(bins["pause"], "pause", 65535)
	if err != nil {
		return nil, err
	}
	if n.PauseImage, err = n.Registry.PushImage(ctx, "pause:3.10", pause); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx, bins["containerd"]); err != nil {
		return nil, err
	}
	if err := n.startKubeProxy(bins["kube-proxy"]); err != nil {
		return nil, err
	}
	if err := n.startClusterDNS(bins["coredns"]); err != nil {
		return nil, err
	}
	if err := n.startKubelet(bins["kubelet"]); err != nil {
		return nil, err
	}
	// Every controller a cluster runs by default: Deployments, Services'
	// endpoints, ServiceAccounts, the root CA, role aggregation, the node
	// lifecycle (which lifts the not-ready taint) and the rest.
	kcm, err := k.StartControllerManager(ctx)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, kcm)
	scheduler, err := k.StartScheduler(ctx)
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, scheduler)
	if err := n.waitReady(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// HostIP is the address at which the node and its pods reach this machine:
// kube-apiserver and the registry listen there, and a coderd started with
// CoderOptions.Host set to it is reachable from pods.
func (n *Node) HostIP() net.IP { return n.Network.HostIP }

// PodCIDR is the subnet of the node's pods.
func (n *Node) PodCIDR() string { return n.Network.PodCIDR }

// NewNode starts a node for a test (see StartNode) and stops it when the
// test ends, before the KubeAPI.
func NewNode(t testing.TB, k *testenv.KubeAPI, network *Network) *Node {
	t.Helper()
	n, err := StartNode(t.Context(), k, network)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range n.procs {
				t.Logf("%s log tail:\n%s", p.Name, p.LogTail(40))
			}
		}
		n.Stop()
	})
	return n
}

// Stop stops the node's components and everything they started: the
// containers, their network namespaces and mounts, and the logs the
// kubelet wrote outside the node's directory.
func (n *Node) Stop() {
	for i := len(n.procs) - 1; i >= 0; i-- {
		n.procs[i].Stop(10 * time.Second)
	}
	n.procs = nil
	// Containers and shims outlive containerd by design; they live in the
	// node's or a pod's network namespace.
	testenv.KillNode(context.Background(), n.Network.Netns)
	if n.Registry != nil {
		n.Registry.Close()
	}
	testenv.ClearNodeDir(n.dir)
}

// startContainerd runs containerd in the node's network namespace with
// its root, state, socket and CNI configuration under the node's
// directory.
func (n *Node) startContainerd(ctx context.Context, bin string) error {
	cniBin, err := testenv.Binary("cni")
	if err != nil {
		return err
	}
	cniConf := filepath.Join(n.dir, "cni", "net.d")
	if err := os.MkdirAll(cniConf, 0o755); err != nil {
		return err
	}
	conflist, err := json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "coder-k8s-test",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.Network.PodCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": filepath.Join(n.dir, "cni", "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cniConf, "10-coder-k8s-test.conflist"), conflist, 0o644); err != nil {
		return err
	}
	sock := n.containerdSocket()
	// restrict_oom_score_adj: these machines deny lowering oom_score_adj,
	// and without it every sandbox fails ("can't get final child's PID
	// from pipe: EOF").
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors.%q]
    endpoint = [%q]
`, filepath.Join(n.dir, "containerd", "root"), filepath.Join(n.dir, "containerd", "state"), sock,
		n.PauseImage, cniBin, cniConf, n.Registry.Host, n.Registry.NodeEndpoint)
	configPath := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	p, err := n.start("containerd", bin, "--config", configPath)
	if err != nil {
		return err
	}
	return p.WaitReady(ctx, time.Minute, func(context.Context) error {
		if _, err := os.Stat(sock); err != nil {
			return err
		}
		if log, _ := os.ReadFile(p.LogPath); !strings.Contains(string(log), "containerd successfully booted") {
			return errors.New("containerd has not booted yet")
		}
		return nil
	})
}

func (n *Node) containerdSocket() string { return filepath.Join(n.dir, "containerd.sock") }

// startKubeProxy runs kube-proxy (iptables mode) in the node's network
// namespace, where its rules stay.
func (n *Node) startKubeProxy(bin string) error {
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
clusterCIDR: %q
hostnameOverride: %q
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# 0: leave the machine-wide conntrack table size and timeouts alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, n.k.KubeconfigPath, n.Network.PodCIDR, n.Name)
	configPath := filepath.Join(n.dir, "kube-proxy.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	_, err := n.start("kube-proxy", bin, "--config", configPath)
	return err
}

// clusterDomain is the test cluster's DNS domain, as in most clusters.
const clusterDomain = "cluster.local"

// startClusterDNS runs CoreDNS with its kubernetes plugin in the node's
// network namespace (port 53 of the node's address is what the kubelet
// gives pods as their name server): Service and pod names under
// cluster.local resolve as in a cluster, nothing else does (no route off
// the machine, no forwarding).
func (n *Node) startClusterDNS(bin string) error {
	corefile := fmt.Sprintf(`%s:53 in-addr.arpa:53 {
    errors
    kubernetes %s in-addr.arpa {
        kubeconfig %s
        pods insecure
    }
}
`, clusterDomain, clusterDomain, n.k.KubeconfigPath)
	path := filepath.Join(n.dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		return err
	}
	p, err := n.start("coredns", bin, "-conf", path)
	if err != nil {
		return err
	}
	// It serves once the kubernetes plugin has synced its caches.
	return p.WaitReady(context.Background(), time.Minute, func(context.Context) error {
		if log, _ := os.ReadFile(p.LogPath); !strings.Contains(string(log), "CoreDNS-") {
			return errors.New("CoreDNS is not serving yet")
		}
		return nil
	})
}

// startKubelet runs the kubelet in the node's network namespace. The
// configuration suits this machine (cgroup v1, no swap accounting, no
// resolv.conf for pods) and the test stack (the admin's credentials, any
// caller of its API allowed: it listens only on the node's private
// address).
func (n *Node) startKubelet(bin string) error {
	root := filepath.Join(n.dir, "kubelet")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %q
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
resolvConf: ""
evictionHard: {}
localStorageCapacityIsolation: false
serializeImagePulls: false
clusterDomain: %s
clusterDNS: [%q]
containerRuntimeEndpoint: %q
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
`, n.Network.NodeIP.String(), clusterDomain, n.Network.NodeIP.String(), "unix://"+n.containerdSocket())
	configPath := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return err
	}
	_, err := n.start("kubelet", bin,
		"--config="+configPath,
		"--kubeconfig="+n.k.KubeconfigPath,
		"--root-dir="+root,
		"--cert-dir="+filepath.Join(root, "pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.Network.NodeIP.String(),
	)
	return err
}

// start runs a node component in the node's network namespace.
func (n *Node) start(name, bin string, args ...string) (*testenv.Process, error) {
	cmd := n.Network.Command(bin, args...)
	cmd.Dir = n.dir
	env := testenv.FilterEnv(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_", "PATH=")
	// containerd finds its shim and runc, kube-proxy iptables, on PATH.
	cmd.Env = append(env, "PATH="+os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin")
	p, err := testenv.StartProcess(name, cmd, filepath.Join(n.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	n.procs = append(n.procs, p)
	return p, nil
}

// waitReady waits until the node reports Ready and has no taint, failing early when one of
// its components exits.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
	defer cancel()
	last := "not registered"
	for {
		for _, p := range n.procs {
			if exited, err := p.Exited(); exited {
				return fmt.Errorf("node: %s exited (%v); log tail:\n%s", p.Name, err, p.LogTail(30))
			}
		}
		node, err := n.k.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					last = fmt.Sprintf("Ready=%s: %s, taints %v", c.Status, c.Message, node.Spec.Taints)
					// Pods schedule once the not-ready taint is gone too.
					if c.Status == corev1.ConditionTrue && len(node.Spec.Taints) == 0 {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			tails := ""
			for _, p := range n.procs {
				tails += fmt.Sprintf("\n%s log tail:\n%s", p.Name, p.LogTail(15))
			}
			return fmt.Errorf("node %s not Ready after %s: %s%s", n.Name, nodeStartTimeout, last, tails)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
