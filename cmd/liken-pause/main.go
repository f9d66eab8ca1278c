// Command liken-pause is the program of the pause image liken's k3s stand-in gives containerd
// as its sandbox image, in the part upstream's pause plays: it holds a pod's namespaces, does
// nothing, reaps the children it inherits as PID 1, and exits 0 when told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	// Said once it stops cleanly: until the Go runtime has run this far, SIGTERM ends any
	// Go program with the signal's code (143), not 0.
	os.Stdout.WriteString("liken-pause: holding the pod's namespaces\n")
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var st syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &st, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
