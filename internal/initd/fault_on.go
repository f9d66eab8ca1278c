//go:build likentest

package initd

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// trapEnv makes liken-init, started by init under liken.test.trap-sigterm, the VM tests'
// stand-in for a container left running after k3s: a process that handles SIGTERM.
const trapEnv = "LIKEN_TEST_TRAP_SIGTERM"

// testHelperMain runs the test helper this process was started as, if any.
func testHelperMain() bool {
	if os.Getenv(trapEnv) == "" || os.Getpid() == 1 {
		return false
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGTERM)
	fmt.Printf("liken-test: process %d traps SIGTERM\n", os.Getpid())
	<-ch
	fmt.Printf("liken-test: process %d got SIGTERM; exiting in 1 s\n", os.Getpid())
	time.Sleep(time.Second)
	os.Exit(0)
	return true
}

// startTestProcesses starts the processes the VM tests ask for (liken.test.trap-sigterm),
// detached from init's supervision as a container's shim is.
func (s *system) startTestProcesses() {
	if s.cmd["liken.test.trap-sigterm"] == "" {
		return
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{trapEnv + "=1"}
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(s.log, "liken-init: test process: %v\n", err)
		return
	}
	go cmd.Wait()
}

// injectTrialFault makes a trial boot fail the way the VM tests ask (liken.test.fail on the
// kernel command line), to prove every failure ends on the last good slot. Without the
// parameter it does nothing.
func (s *system) injectTrialFault() {
	switch f := s.cmd["liken.test.fail"]; f {
	case "":
	case "panic":
		fmt.Fprintln(s.log, "liken-init: test fault: kernel panic")
		os.WriteFile("/proc/sys/kernel/sysrq", []byte("1"), 0o644)
		os.WriteFile("/proc/sysrq-trigger", []byte("c"), 0o200)
	case "init-exit":
		fmt.Fprintln(s.log, "liken-init: test fault: init exits")
		os.Exit(1) // PID 1 exiting panics the kernel
	case "hang":
		fmt.Fprintln(s.log, "liken-init: test fault: the machine hangs (the watchdog is no longer fed)")
		// Freeze every other process and stop feeding the watchdog: only the watchdog can
		// end this boot.
		unix.Kill(-1, unix.SIGSTOP)
		s.watchdog.Starve()
		select {}
	default:
		fmt.Fprintf(s.log, "liken-init: unknown test fault %q ignored\n", f)
	}
}

// showScreen prints, under liken.test.screen, the text the screen (VT 1) shows, read from
// /dev/vcsa1 (its size and cursor, then a character and an attribute per cell), one
// "liken-test: screen: " line per non-empty row: the VM tests cannot read a framebuffer, so
// the screen says what it shows on the serial port.
func (s *system) showScreen() {
	if s.cmd["liken.test.screen"] == "" {
		return
	}
	b, err := os.ReadFile("/dev/vcsa1")
	if err != nil || len(b) < 4 {
		fmt.Fprintf(s.log, "liken-test: screen: unreadable (%v)\n", err)
		return
	}
	rows, cols := int(b[0]), int(b[1])
	cells := b[4:]
	var out strings.Builder
	for r := 0; r < rows && (r+1)*cols*2 <= len(cells); r++ {
		line := make([]byte, cols)
		for c := 0; c < cols; c++ {
			line[c] = cells[(r*cols+c)*2]
		}
		if t := strings.TrimRight(string(line), " \x00"); t != "" {
			fmt.Fprintf(&out, "liken-test: screen: %s\n", t)
		}
	}
	fmt.Fprintf(s.log, "liken-test: screen: %dx%d, /dev/vcsa1\n%s", cols, rows, out.String())
}
