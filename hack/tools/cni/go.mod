module github.com/coder/coder-k8s/hack/tools/cni

go 1.26.0

require github.com/containernetworking/plugins v1.6.2

require (
	github.com/alexflint/go-filemutex v1.3.0 // indirect
	github.com/containernetworking/cni v1.2.3 // indirect
	github.com/coreos/go-iptables v0.8.0 // indirect
	github.com/mattn/go-shellwords v1.0.12 // indirect
	github.com/networkplumbing/go-nft v0.4.0 // indirect
	github.com/safchain/ethtool v0.5.9 // indirect
	github.com/vishvananda/netlink v1.3.0 // indirect
	github.com/vishvananda/netns v0.0.4 // indirect
	golang.org/x/sys v0.27.0 // indirect
	sigs.k8s.io/knftables v0.0.18 // indirect
)
