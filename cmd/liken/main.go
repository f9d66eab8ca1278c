// Command liken is the operator's tool: it builds deployment layers, installs machines,
// approves and requests reboots, and validates manifests. See `liken --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"liken.dev/liken/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
