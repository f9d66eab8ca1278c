package initd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/internal/host/hardware"
	"liken.dev/liken/internal/state"
)

// A clean shutdown is init's work: k3s's containers outlive k3s by design (their shims are
// not its children), and the kubelet's graceful node shutdown relies on systemd, which
// liken does not have. So at every reboot and power-off init stops the containers, then
// k3s, then every process left, and only then unmounts and syncs.
const (
	// containerStopTimeout is what each container gets to stop (crictl stop --timeout).
	containerStopTimeout = 30 * time.Second
	// shutdownGrace is how long the processes left after k3s get between SIGTERM and SIGKILL.
	shutdownGrace = 10 * time.Second
	// shutdownBudget bounds a shutdown: the agent's stop (30 s), listing and stopping the
	// containers and their pods (30 + 45 + 60 s), k3s's stop (30 s), the processes' grace
	// and SIGKILL (15 s), and the unmounts, with room to spare.
	shutdownBudget = 5 * time.Minute
)

// shutdown stops everything in order and leaves the state partition clean: the agent (on a
// server its last words need k3s's API server), the containers, k3s, then every process
// left (SIGTERM, a grace, SIGKILL), k3s's mounts, and the state partition. It records in
// the boot log whether it was clean.
func (s *system) shutdown(stopAgent func(), agentDone <-chan struct{}, stopK3s func(), k3sDone <-chan struct{}) {
	start := time.Now()
	// A shutdown that hangs (a mount that never lets go) must not hang the machine: the
	// watchdog is pinged only until the longest a shutdown takes, then resets it.
	s.watchdog.PingUntil(start.Add(shutdownBudget))
	holdReaper() // for good: its commands are waited for here; endProcesses reaps the rest
	fmt.Fprintln(s.log, "liken-init: shutting down: the agent, the containers, k3s, then every process left")
	stopAgent()
	<-agentDone
	s.stopContainers()
	stopK3s()
	<-k3sDone
	termed, killed := endProcesses(s.log, shutdownGrace)
	how := "clean"
	if killed > 0 {
		how = fmt.Sprintf("forced: %d of %d processes left after k3s outlived SIGTERM's %s grace and were killed", killed, termed, shutdownGrace)
	}
	n, err := unmountUnder(k3sMounts)
	if err != nil {
		how = fmt.Sprintf("unclean: %v", err)
		fmt.Fprintf(s.log, "liken-init: %v\n", err)
	}
	s.boot.record(func(r *state.BootRecord) { r.Shutdown = how })
	s.releaseDisks()
	fmt.Fprintf(s.log, "liken-init: shutdown %s in %s (%d processes got SIGTERM after k3s, %d needed SIGKILL; %d of k3s's mounts unmounted)\n",
		how, time.Since(start).Round(10*time.Millisecond), termed, killed, n)
}

// releaseDisks unmounts the data disks, then the state partition (or remounts it read-only
// if it stays busy), so the next boot finds every file system clean.
func (s *system) releaseDisks() {
	s.unmountDataDisks()
	s.closeLogs() // on the state partition: open, they would keep it busy
	unix.Sync()
	unix.Unmount("/etc/rancher", 0)
	if err := unix.Unmount(stateMount, 0); err != nil {
		fmt.Fprintf(s.log, "liken-init: unmounting the state partition: %v; remounting it read-only\n", err)
		if err := unix.Mount("", stateMount, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			fmt.Fprintf(s.log, "liken-init: remounting the state partition read-only: %v: the next boot replays its journal\n", err)
		}
	}
	unix.Sync()
}

// stopContainers asks k3s's containerd to stop every container, each with its grace, then
// every pod sandbox, while k3s still runs (containerd is its child). The stand-in runs no
// containers. Failures are printed: they never hold a shutdown back.
func (s *system) stopContainers() {
	if standIn() {
		return
	}
	crictl := func(timeout time.Duration, args ...string) ([]string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, "/usr/bin/k3s", append([]string{"crictl"}, args...)...).Output()
		return strings.Fields(string(out)), err
	}
	ids, err := crictl(30*time.Second, "ps", "-q")
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: listing containers (k3s crictl ps): %v\n", err)
	} else if len(ids) > 0 {
		// All at once, each with its own grace: one after another, a few slow ones would
		// take minutes.
		fmt.Fprintf(s.log, "liken-init: stopping %d containers (each may take %s)\n", len(ids), containerStopTimeout)
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := crictl(containerStopTimeout+15*time.Second, "stop", "--timeout", strconv.Itoa(int(containerStopTimeout.Seconds())), id); err != nil {
					fmt.Fprintf(s.log, "liken-init: stopping container %s: %v\n", id, err)
				}
			}()
		}
		wg.Wait()
	}
	if pods, err := crictl(30*time.Second, "pods", "-q"); err != nil {
		fmt.Fprintf(s.log, "liken-init: listing pods (k3s crictl pods): %v\n", err)
	} else if len(pods) > 0 {
		if _, err := crictl(60*time.Second, append([]string{"stopp"}, pods...)...); err != nil {
			fmt.Fprintf(s.log, "liken-init: stopping pods: %v\n", err)
		}
	}
}

// endProcesses sends SIGTERM to every process but init, waits up to grace for them to
// exit, then sends SIGKILL to what is left. It returns how many got SIGTERM and how many
// needed SIGKILL.
func endProcesses(log io.Writer, grace time.Duration) (termed, killed int) {
	left := userProcesses()
	if len(left) == 0 {
		return 0, 0
	}
	termed = len(left)
	fmt.Fprintf(log, "liken-init: sending SIGTERM to %d processes left: %s\n", termed, strings.Join(names(left), ", "))
	unix.Kill(-1, unix.SIGTERM) // every process but init
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		reapAll()
		if left = userProcesses(); len(left) == 0 {
			return termed, 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	killed = len(left)
	fmt.Fprintf(log, "liken-init: %d processes outlived the %s grace; sending SIGKILL: %s\n", killed, grace, strings.Join(names(left), ", "))
	unix.Kill(-1, unix.SIGKILL)
	for i := 0; i < 50 && len(userProcesses()) > 0; i++ {
		reapAll()
		time.Sleep(100 * time.Millisecond)
	}
	return termed, killed
}

// reapAll collects every exited child of init that nothing else waits for.
func reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// userProcesses are the PIDs of every live process but init and the kernel's threads,
// with their names.
func userProcesses() map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		name, st, ok := parseStat(string(b))
		if ok && st.state != 'Z' && st.flags&pfKthread == 0 {
			out[pid] = name
		}
	}
	return out
}

const pfKthread = 0x00200000 // PF_KTHREAD, include/linux/sched.h

type procStat struct {
	state byte
	flags uint64
}

// parseStat reads a /proc/PID/stat line: the name in parentheses (which may hold spaces and
// parentheses), the state, and the flags (the ninth field).
func parseStat(line string) (string, procStat, bool) {
	open, close := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || close < open {
		return "", procStat{}, false
	}
	f := strings.Fields(line[close+1:])
	if len(f) < 7 {
		return "", procStat{}, false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return line[open+1 : close], procStat{state: f[0][0], flags: flags}, err == nil
}

func names(procs map[int]string) []string {
	var out []string
	for pid, n := range procs {
		out = append(out, fmt.Sprintf("%s[%d]", n, pid))
	}
	sort.Strings(out)
	if len(out) > 12 {
		out = append(out[:12], fmt.Sprintf("and %d more", len(out)-12))
	}
	return out
}

// k3sMounts are the mount points k3s's own k3s-killall.sh unmounts (install.sh,
// do_unmount_and_remove): its runtime directory, its data directory's mounts (container
// root filesystems), the kubelet's pod volumes and plugins, and CNI's network namespaces.
var k3sMounts = []string{"/run/k3s", "/var/lib/rancher/k3s", "/var/lib/kubelet/pods", "/var/lib/kubelet/plugins", "/run/netns/cni-"}

// unmountUnder unmounts every mount point with one of the prefixes, deepest first. It
// returns how many it unmounted and the first failure.
func unmountUnder(prefixes []string) (int, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return 0, err
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		p := hardware.UnescapeMount(fields[1])
		for _, pre := range prefixes {
			if strings.HasPrefix(p, pre) {
				points = append(points, p)
				break
			}
		}
	}
	f.Close()
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var first error
	n := 0
	for _, p := range points {
		if err := unix.Unmount(p, 0); err != nil {
			// Busy after every process is gone: detach it, so the state partition below it
			// can still be unmounted once the kernel lets go.
			if err2 := unix.Unmount(p, unix.MNT_DETACH); err2 != nil && first == nil {
				first = fmt.Errorf("unmounting %s: %w", p, err)
			}
		}
		n++
	}
	return n, first
}
