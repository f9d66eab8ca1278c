package initd

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// exitedChild starts /bin/true and waits until it is a zombie nobody collected yet.
func exitedChild(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err == nil && info.Signo != 0 {
			return cmd
		}
	}
	t.Fatal("the child did not exit")
	return nil
}

// TestReaperHeld: while one of init's commands holds the reaper, a reap pass leaves the
// command's exit to its own wait, which succeeds; without the hold the pass collects it and
// the wait fails as mke2fs's did in a VM ("waitid: no child processes"), which shows this
// test can see the failure. Holds overlap: the first release keeps the second in force.
func TestReaperHeld(t *testing.T) {
	first, second := holdReaper(), holdReaper()
	cmd := exitedChild(t)
	first()
	first() // a release counts once
	reapOrphans()
	if err := cmd.Wait(); err != nil {
		t.Errorf("a command's wait while the reaper was held: %v", err)
	}
	second()
	select {
	case <-reaper.again:
	default:
		t.Error("the last release did not ask reap to look again")
	}

	cmd = exitedChild(t)
	reapOrphans()
	if err := cmd.Wait(); err == nil {
		t.Error("a reap pass with no hold left the child's exit: the test cannot tell a held reaper from a lazy one")
	}
}
