package testenv

// What a test node (package nodeenv) leaves on this machine, and how it is
// cleared: by the node when it stops, and by Sweep in any later test
// process when its owner was killed. It is here, not in nodeenv, so that
// the Sweep of a test that starts no node still clears a killed run's node.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
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

// NodeNetworkNames names node network index's parts: the network
// namespace (ck8s-<this process's PID>-<index>, so that Sweep can tell
// whose it is) and the host's and the node's ends of its veth pair (unique
// on the machine, so creating the pair claims the index).
func NodeNetworkNames(index int) (netns, hostLink, nodeLink string) {
	return fmt.Sprintf("%s%d-%d", nodeNetnsPrefix, os.Getpid(), index), hostLinkName(strconv.Itoa(index)), fmt.Sprintf("ck8s%dn", index)
}

// hostLinkName names the host's end of node network index's link.
func hostLinkName(index string) string { return "ck8s" + index + "h" }

// NetnsPath is the file of the named network namespace.
func NetnsPath(name string) string { return filepath.Join(netnsDir, name) }

// KillNode kills every process in node network namespace netns or in one
// of its pods' (kubelet, containerd, its shims, kube-proxy, containers),
// which outlive containerd by design, and deletes the pods' namespaces.
func KillNode(ctx context.Context, netns string) {
	pods := PodNetns(ctx, netns)
	var ids []fileID
	for _, ns := range append([]string{netns}, pods...) {
		if id, ok := statID(NetnsPath(ns)); ok {
			ids = append(ids, id)
		}
	}
	killProcessesInNetns(ids)
	for _, ns := range pods {
		_, _ = RunOutput(ctx, "ip", "netns", "del", ns)
	}
}

// RemoveNodeNetns kills what runs on the node (see KillNode), then deletes
// its network namespace. That removes the node's end of the veth pair, so
// the host's end and the routes to the pod and Service subnets go with it.
func RemoveNodeNetns(netns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	KillNode(ctx, netns)
	_, _ = RunOutput(ctx, "ip", "netns", "del", netns)
	// The kernel dismantles a namespace asynchronously: wait until the
	// host's end of the link (and with it the route) is gone, so the
	// index is free again when this returns.
	if i := strings.LastIndex(netns, "-"); i > 0 {
		hostLink := filepath.Join("/sys/class/net", hostLinkName(netns[i+1:]))
		for ctx.Err() == nil {
			if _, err := os.Stat(hostLink); os.IsNotExist(err) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

var linkNetns = regexp.MustCompile(`link-netns (\S+)`)

// PodNetns names the network namespaces at the other end of node network
// namespace node's veth links: its pods' (containerd names them cni-<uuid>).
func PodNetns(ctx context.Context, node string) []string {
	out, err := RunOutput(ctx, "ip", "-n", node, "-o", "link", "show", "type", "veth")
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
			RemoveNodeNetns(e.Name())
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

// ClearNodeDir undoes what the node whose directory is dir did outside
// it and in it that os.RemoveAll cannot: it removes the kubelet's pod logs
// under /var/log (see removeNodeFiles) and detaches the mounts under dir.
func ClearNodeDir(dir string) {
	removeNodeFiles(dir)
	unmountUnder(dir)
}

// removeNodeFiles removes what the kubelet of the node in dir wrote
// outside it: /var/log/pods/<namespace>_<pod>_<uid> for each pod it ran,
// and the /var/log/containers links into them.
func removeNodeFiles(dir string) {
	pods, _ := filepath.Glob(filepath.Join(dir, "kubelet", "pods", "*"))
	if len(pods) == 0 {
		return
	}
	for _, p := range pods {
		logs, _ := filepath.Glob(filepath.Join("/var/log/pods", "*_"+filepath.Base(p)))
		for _, l := range logs {
			_ = os.RemoveAll(l)
		}
	}
	links, _ := filepath.Glob("/var/log/containers/*")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, "/var/log/pods/") {
			if _, err := os.Stat(target); errors.Is(err, os.ErrNotExist) {
				_ = os.Remove(l)
			}
		}
	}
}
