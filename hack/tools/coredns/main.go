// Command coredns is CoreDNS with only the plugins the test node's cluster
// DNS uses (kubernetes, errors, log), so it builds quickly from CoreDNS's
// Go module.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	// The order plugins run in, as CoreDNS's plugin.cfg gives it.
	dnsserver.Directives = []string{"errors", "log", "kubernetes"}
}

func main() { coremain.Run() }
