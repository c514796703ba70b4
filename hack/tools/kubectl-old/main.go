// Command kubectl is kubectl 1.32, the oldest release the aggregated API
// supports, built from the pinned k8s.io/kubectl module for the
// compatibility tests (bin/kubectl-1.32). The main is that of
// k8s.io/kubernetes v1.32's cmd/kubectl/kubectl.go.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// Import to initialize client auth plugins.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error.
		util.CheckErr(err)
	}
}
