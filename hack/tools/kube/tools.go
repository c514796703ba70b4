//go:build tools

// Package tools pins the Kubernetes binaries the test stack builds:
// kube-apiserver, kube-controller-manager, kubectl and the node's kubelet,
// kube-scheduler and kube-proxy, at the version in go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
