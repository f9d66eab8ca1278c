//go:build !likentest

package initramfs

import "io"

// injectFault does nothing in a normal release: the faults are built only into releases
// built for tests (fault_on.go).
func injectFault(io.Writer, Cmdline, *trialWatchdog) {}
