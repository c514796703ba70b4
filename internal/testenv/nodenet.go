package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// netnsDir is where `ip netns` and containerd keep named network namespaces.
const netnsDir = "/var/run/netns"

// nodeNetnsPrefix starts the name of every node network namespace the stack
// creates: ck8s-<owner pid>-<index>, so Sweep can tell whose it is.
const nodeNetnsPrefix = "ck8s-"

// nodeNetwork is the private network of a test node: a network namespace
// holding the node's end of a veth pair, whose host end carries the address
// kube-apiserver and the registry listen on. Pods live on a bridge inside
// the node's namespace; the host routes their subnet and the Service
// subnet to the node (where kube-proxy translates Service addresses), so
// tests on the host reach Services as a pod would. The node has no
// default route, so pod traffic stays on this machine.
type nodeNetwork struct {
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

// newNodeNetwork creates a node network with the first free index: the
// veth pair's names are unique on the machine, so creating it claims the
// index (and its subnets) atomically.
func newNodeNetwork(ctx context.Context) (*nodeNetwork, error) {
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("node network: %s not found (iproute2 and util-linux): run `make tools`", tool)
		}
	}
	for i := 0; i < 250; i++ {
		hostLink, nodeLink := hostLinkName(strconv.Itoa(i)), fmt.Sprintf("ck8s%dn", i)
		out, err := runOutput(ctx, "ip", "link", "add", hostLink, "type", "veth", "peer", "name", nodeLink)
		if err != nil {
			if strings.Contains(out, "File exists") {
				continue
			}
			return nil, fmt.Errorf("node network: %w", err)
		}
		n := &nodeNetwork{
			Netns:               fmt.Sprintf("%s%d-%d", nodeNetnsPrefix, os.Getpid(), i),
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
			if out, err := runOutput(ctx, s[0], s[1:]...); err != nil {
				_, _ = runOutput(ctx, "ip", "link", "del", hostLink)
				n.remove()
				return nil, fmt.Errorf("node network: %w: %s", err, out)
			}
		}
		// Without br_netfilter in the namespace, a pod's reply to another
		// pod through a Service bypasses kube-proxy's conntrack; best
		// effort, the kernel may not have it.
		brnf := n.exec("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1")
		_, _ = runOutput(ctx, brnf[0], brnf[1:]...)
		return n, nil
	}
	return nil, fmt.Errorf("node network: the 250 node links ck8s0h..ck8s249h all exist")
}

// hostLinkName names the host's end of node network index's link.
func hostLinkName(index string) string { return "ck8s" + index + "h" }

// exec is the command line running name with args in the node's network
// namespace (and only that: the mount namespace stays the host's, so the
// kubelet and containerd see each other's mounts).
func (n *nodeNetwork) exec(name string, args ...string) []string {
	return append([]string{"nsenter", "--net=" + filepath.Join(netnsDir, n.Netns), "--", name}, args...)
}

// Command is exec as an *exec.Cmd.
func (n *nodeNetwork) Command(name string, args ...string) *exec.Cmd {
	argv := n.exec(name, args...)
	return exec.Command(argv[0], argv[1:]...)
}

// remove kills everything running on the node and deletes its network
// (see removeNodeNetns).
func (n *nodeNetwork) remove() {
	if n != nil {
		removeNodeNetns(n.Netns)
	}
}

// removeNodeNetns kills every process in the node's network namespace or
// in a pod's (kubelet, containerd, its shims, kube-proxy, containers),
// then deletes the pods' namespaces and the node's. Deleting the node's
// namespace removes its end of the veth pair, so the host's end and the
// route to the pod subnet go with it.
func removeNodeNetns(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods := podNetnsOf(ctx, name)
	var ids []fileID
	for _, ns := range append([]string{name}, pods...) {
		if id, ok := statID(filepath.Join(netnsDir, ns)); ok {
			ids = append(ids, id)
		}
	}
	killProcessesInNetns(ids)
	for _, ns := range pods {
		_, _ = runOutput(ctx, "ip", "netns", "del", ns)
	}
	_, _ = runOutput(ctx, "ip", "netns", "del", name)
	// The kernel dismantles a namespace asynchronously: wait until the
	// host's end of the link (and with it the route) is gone, so the
	// index is free again when this returns.
	if i := strings.LastIndex(name, "-"); i > 0 {
		hostLink := filepath.Join("/sys/class/net", hostLinkName(name[i+1:]))
		for ctx.Err() == nil {
			if _, err := os.Stat(hostLink); os.IsNotExist(err) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

var linkNetns = regexp.MustCompile(`link-netns (\S+)`)

// podNetnsOf names the network namespaces at the other end of the node's
// veth links: its pods' (containerd names them cni-<uuid>).
func podNetnsOf(ctx context.Context, node string) []string {
	out, err := runOutput(ctx, "ip", "-n", node, "-o", "link", "show", "type", "veth")
	if err != nil {
		return nil
	}
	var pods []string
	for _, m := range linkNetns.FindAllStringSubmatch(out, -1) {
		if m[1] != node && !strings.HasPrefix(m[1], nodeNetnsPrefix) {
			pods = append(pods, m[1])
		}
	}
	return pods
}

// fileID identifies a namespace: the device and inode of its nsfs file.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), st.Ino}, true
}

// killProcessesInNetns SIGKILLs every process whose network namespace is
// one of ids and waits (up to 10 s) until none is left.
func killProcessesInNetns(ids []fileID) {
	if len(ids) == 0 {
		return
	}
	in := func(pid string) bool {
		id, ok := statID(filepath.Join("/proc", pid, "ns", "net"))
		if !ok {
			return false
		}
		for _, want := range ids {
			if id == want {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		left := 0
		for _, p := range procs {
			pidStr := filepath.Base(p)
			pid, _ := strconv.Atoi(pidStr)
			if pid == os.Getpid() || !in(pidStr) {
				continue
			}
			// A zombie keeps its namespace link until reaped; only count
			// processes that still run.
			if state, _ := os.ReadFile(filepath.Join(p, "stat")); strings.Contains(string(state), ") Z ") {
				continue
			}
			left++
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sweepNodeNetworks removes the node networks of owners that are gone.
func sweepNodeNetworks() {
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), nodeNetnsPrefix)
		if !ok {
			continue
		}
		owner, _, _ := strings.Cut(rest, "-")
		if o, err := strconv.Atoi(owner); err == nil && o != os.Getpid() && !alive(o) {
			removeNodeNetns(e.Name())
		}
	}
}

// unmountUnder detaches every mount below dir, deepest first: a node's
// kubelet volumes and containerd's container file systems, which
// os.RemoveAll would otherwise descend into.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	prefix := filepath.Clean(dir) + "/"
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if strings.HasPrefix(mp, prefix) {
			points = append(points, mp)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, mp := range points {
		_ = syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// runOutput runs a command and returns its combined output; the error
// carries the command line.
func runOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
