//go:build likentest

package initramfs

import (
	"fmt"
	"io"
)

// injectFault makes a trial boot hang in the initramfs when the VM tests ask
// (liken.test.fail=initramfs-hang): the watchdog is no longer fed, and only it can end the boot.
func injectFault(log io.Writer, cmd Cmdline, w *trialWatchdog) {
	if cmd["liken.test.fail"] != "initramfs-hang" || cmd["liken.trial"] != "1" {
		return
	}
	fmt.Fprintln(log, "liken-init: test fault: the initramfs hangs before mounting the slot (the watchdog is no longer fed)")
	if w != nil {
		w.fed.Store(false)
	}
	select {}
}
