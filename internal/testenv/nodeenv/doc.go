// Package nodeenv runs a real Kubernetes node for a testenv.KubeAPI: its
// private network (Network: a network namespace and a veth pair, created
// before kube-apiserver, which serves on it through
// testenv.KubeAPIOptions.Node, and removed after it), the kubelet,
// containerd and runc, kube-proxy, a CNI bridge and CoreDNS in that
// namespace, kube-scheduler and kube-controller-manager beside
// kube-apiserver (Node), and an in-memory OCI registry the node pulls from
// (Registry). It also builds the images tests push there (CoderImage) and
// reads the one `make image` wrote (ShippedImage).
//
// It links go-containerregistry, which package testenv does not, so only
// the tests that start a node link it.
package nodeenv
