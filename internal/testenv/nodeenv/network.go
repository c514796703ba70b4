package nodeenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Network is the private network of a test node: a network namespace
// holding the node's end of a veth pair, whose host end carries the address
// kube-apiserver and the registry listen on. Pods live on a bridge inside
// the node's namespace; the host routes their subnet and the Service
// subnet to the node (where kube-proxy translates Service addresses), so
// tests on the host reach Services as a pod would. The node has no
// default route, so pod traffic stays on this machine.
type Network struct {
	// Netns names the node's network namespace under /var/run/netns.
	Netns string
	// HostIP is the host's end of the link: what the node and its pods
	// reach this machine at.
	HostIP net.IP
	// NodeIP is the node's end: the kubelet's InternalIP.
	NodeIP net.IP
	// PodCIDR is the subnet of the node's pod bridge.
	PodCIDR string
	// ServiceCIDR is kube-apiserver's --service-cluster-ip-range, one per
	// node so that the host's routes to several stacks' Services differ.
	ServiceCIDR string
	// KubernetesServiceIP is the kubernetes Service's address: the first
	// of ServiceCIDR.
	KubernetesServiceIP net.IP
}

// StartNetwork creates a node network with the first free index: the veth
// pair's names are unique on the machine, so creating it claims the index
// (and its subnets) atomically. Start the KubeAPI the node will use with
// KubeAPIOptions.Node set to its Serving, and Remove it after that
// KubeAPI stops.
func StartNetwork(ctx context.Context) (*Network, error) {
	testenv.Sweep()
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("node network: %s not found (iproute2 and util-linux): run `make tools`", tool)
		}
	}
	for i := 0; i < 250; i++ {
		netns, hostLink, nodeLink := testenv.NodeNetworkNames(i)
		out, err := testenv.RunOutput(ctx, "ip", "link", "add", hostLink, "type", "veth", "peer", "name", nodeLink)
		if err != nil {
			if strings.Contains(out, "File exists") {
				continue
			}
			return nil, fmt.Errorf("node network: %w", err)
		}
		n := &Network{
			Netns:               netns,
			HostIP:              net.IPv4(10, 251, byte(i), 1),
			NodeIP:              net.IPv4(10, 251, byte(i), 2),
			PodCIDR:             fmt.Sprintf("10.252.%d.0/24", i),
			ServiceCIDR:         fmt.Sprintf("10.253.%d.0/24", i),
			KubernetesServiceIP: net.IPv4(10, 253, byte(i), 1),
		}
		steps := [][]string{
			{"ip", "netns", "add", n.Netns},
			{"ip", "link", "set", nodeLink, "netns", n.Netns},
			{"ip", "addr", "add", n.HostIP.String() + "/30", "dev", hostLink},
			{"ip", "link", "set", hostLink, "up"},
			{"ip", "-n", n.Netns, "link", "set", "lo", "up"},
			{"ip", "-n", n.Netns, "addr", "add", n.NodeIP.String() + "/30", "dev", nodeLink},
			{"ip", "-n", n.Netns, "link", "set", nodeLink, "up"},
			// Connections the node itself opens to a Service (host-network
			// pods) need a route before kube-proxy's DNAT picks the
			// endpoint.
			{"ip", "-n", n.Netns, "route", "add", n.ServiceCIDR, "via", n.HostIP.String()},
			{"ip", "route", "add", n.PodCIDR, "via", n.NodeIP.String(), "dev", hostLink},
			{"ip", "route", "add", n.ServiceCIDR, "via", n.NodeIP.String(), "dev", hostLink},
			// The node routes between its link and the pod bridge.
			n.exec("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"),
		}
		for _, s := range steps {
			if out, err := testenv.RunOutput(ctx, s[0], s[1:]...); err != nil {
				_, _ = testenv.RunOutput(ctx, "ip", "link", "del", hostLink)
				n.Remove()
				return nil, fmt.Errorf("node network: %w: %s", err, out)
			}
		}
		// Without br_netfilter in the namespace, a pod's reply to another
		// pod through a Service bypasses kube-proxy's conntrack; best
		// effort, the kernel may not have it.
		brnf := n.exec("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")
		_, _ = testenv.RunOutput(ctx, brnf[0], brnf[1:]...)
		return n, nil
	}
	return nil, fmt.Errorf("node network: the 250 node links ck8s0h..ck8s249h all exist")
}

// exec is the command line running name with args in the node's network
// namespace (and only that: the mount namespace stays the host's, so the
// kubelet and containerd see each other's mounts).
func (n *Network) exec(name string, args ...string) []string {
	return append([]string{"nsenter", "--net=" + testenv.NetnsPath(n.Netns), "--", name}, args...)
}

// Command is exec as an *exec.Cmd.
func (n *Network) Command(name string, args ...string) *exec.Cmd {
	argv := n.exec(name, args...)
	return exec.Command(argv[0], argv[1:]...)
}

// Remove kills everything running on the node and deletes its network
// (see testenv.RemoveNodeNetns).
func (n *Network) Remove() {
	if n != nil {
		testenv.RemoveNodeNetns(n.Netns)
	}
}

// NewNetwork creates a node network for a test (see StartNetwork) and
// removes it when the test ends: after the KubeAPI, when that is started
// next.
func NewNetwork(t testing.TB) *Network {
	t.Helper()
	n, err := StartNetwork(t.Context())
	if err != nil {
		t.Fatalf("node network: %v", err)
	}
	t.Cleanup(n.Remove)
	return n
}

// Serving is what kube-apiserver needs to serve a node on n, for
// testenv.KubeAPIOptions.Node.
func (n *Network) Serving() *testenv.NodeServing {
	return &testenv.NodeServing{HostIP: n.HostIP, ServiceCIDR: n.ServiceCIDR, KubernetesServiceIP: n.KubernetesServiceIP}
}
