// Command coder is Coder's AGPL CLI and server (`coder server`), built from the
// pinned module so the test stack runs a real coderd without a download.
package main

import (
	"fmt"
	"os"
	_ "time/tzdata"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/coder/coder/v2/agent/agentexec"
	"github.com/coder/coder/v2/cli"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agent-exec" {
		err := agentexec.CLI()
		_, _ = fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tea.InitTerminal()
	var root cli.RootCmd
	root.RunWithSubcommands(root.AGPL())
}
