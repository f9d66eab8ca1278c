//go:build !likentest

package initramfs

import (
	"io"

	"liken.dev/liken/internal/host/watchdog"
)

// injectFault does nothing in a normal release: the faults are built only into releases
// built for tests (fault_on.go).
func injectFault(io.Writer, Cmdline, *watchdog.Dog) {}
