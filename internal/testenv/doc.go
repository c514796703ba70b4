// Package testenv starts the real components coder-k8s is tested against:
// kube-apiserver + etcd (KubeAPI, with kube-controller-manager and
// kube-scheduler beside it on demand), and PostgreSQL + coderd with an
// OpenTofu Terraform provisioner (Coder). Tests use the New* helpers, which
// stop everything when the test ends; `make dev` uses the Start* functions.
//
// A real node and its OCI registry are in subpackage nodeenv, which links
// go-containerregistry; this package does not, so a unit test links only
// what it starts. A KubeAPI serves a node's network when
// KubeAPIOptions.Node says so, but does not own it. Sweep, which every
// Start* runs, still clears what a killed run's node left behind
// (nodeleftovers.go), whichever test process runs next.
//
// The binaries come from `make tools` (bin/, or $CODER_K8S_BIN_DIR). A
// missing binary fails the test with a message naming `make tools`.
package testenv
