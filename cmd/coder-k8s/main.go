// Command coder-k8s runs the coder-k8s operator: the controller, the
// aggregated API server and the MCP server, as its configuration says.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/coder/coder-k8s/internal/command"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := command.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
