// Command k3s-standin is liken's stand-in for k3s, for tests only (see internal/standin). It is
// not k3s. Run by other names through its data directory's links, it is the iptables, mount
// and flannel CNI programs k3s bundles.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"liken.dev/liken/internal/standin"
	"liken.dev/liken/internal/standin/flannel"
)

func main() {
	if code, ok := standin.IptablesMain(os.Args[0], os.Stderr); ok {
		os.Exit(code)
	}
	if code, ok := standin.MountMain(os.Args[0], os.Args[1:], os.Stderr); ok {
		os.Exit(code)
	}
	if flannel.CNIMain(os.Args[0]) { // run as the CNI plugin named flannel
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := standin.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
