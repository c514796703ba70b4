// Package testenv starts the real components coder-k8s is tested against:
// kube-apiserver + etcd (KubeAPI), and PostgreSQL + coderd with an OpenTofu
// Terraform provisioner (Coder). Tests use the New* helpers, which stop
// everything when the test ends; `make dev` uses the Start* functions.
//
// The binaries come from `make tools` (bin/, or $CODER_K8S_BIN_DIR). A
// missing binary fails the test with a message naming `make tools`.
package testenv
