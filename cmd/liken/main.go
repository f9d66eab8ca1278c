// Command liken is the operator's tool: it builds deployment layers, installs machines,
// approves and requests reboots, and validates manifests. See `liken --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/rest"

	"liken.dev/liken/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The API server's warnings (a change's class, say) as kubectl prints them, for every
	// client the command makes; those of --kubeconfig's commands go to the command's stderr.
	rest.SetDefaultWarningHandler(cli.WarningPrinter(os.Stderr))
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
