// Command liken-init is PID 1 on every liken machine (see internal/initd). Run as modprobe
// (/sbin/modprobe links to it), it is liken's modprobe (internal/kmod).
package main

import (
	"os"
	"path/filepath"

	"liken.dev/liken/internal/initd"
	"liken.dev/liken/internal/kmod"
)

func main() {
	if filepath.Base(os.Args[0]) == "modprobe" {
		os.Exit(kmod.ModprobeMain(os.Args[1:], os.Stderr))
	}
	initd.Main()
}
