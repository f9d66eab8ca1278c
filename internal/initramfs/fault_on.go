//go:build likentest

package initramfs

import (
	"fmt"
	"io"

	"liken.dev/liken/internal/host/watchdog"
)

// injectFault makes a trial boot hang in the initramfs when the VM tests ask
// (liken.test.fail=initramfs-hang): the watchdog is no longer fed, and only it can end the boot.
func injectFault(log io.Writer, cmd Cmdline, w *watchdog.Dog) {
	if cmd["liken.test.fail"] != "initramfs-hang" || cmd["liken.trial"] != "1" {
		return
	}
	fmt.Fprintln(log, "liken-init: test fault: the initramfs hangs before mounting the slot (the watchdog is no longer fed)")
	w.Starve()
	select {}
}
