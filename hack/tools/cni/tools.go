//go:build tools

// Package tools pins the CNI plugins the test stack's node uses: bridge,
// host-local, loopback and portmap, at the version in go.mod.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
