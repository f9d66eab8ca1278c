package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every process a lab starts carries its directory in TagEnv and its own name in NameEnv. The
// environment, read back from /proc, finds the lab's processes whatever state the lab is in:
// lab.json stale or not yet written, the directory removed, `up` killed before it recorded a
// PID. Children inherit it, so whatever a lab process starts is found too. An exact value,
// unlike a command line holding the path, never matches another lab in /tmp/lab-2 for
// /tmp/lab.
const (
	TagEnv  = "LIKEN_LAB"
	NameEnv = "LIKEN_LAB_PROCESS"
)

// Proc is a running process of a lab.
type Proc struct {
	PID int
	// Name is what the lab started it as (a machine's name, "channel server").
	Name string
	// Command is the program (its first argument).
	Command string
}

func (p Proc) String() string { return fmt.Sprintf("%s (%s, pid %d)", p.Name, p.Command, p.PID) }

func list(procs []Proc) string {
	s := make([]string, len(procs))
	for i, p := range procs {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// start starts cmd as the lab's process name, tagged, detached from this process (its own
// session, so a Ctrl-C at `liken lab up` does not reach it and it outlives `up`). done is
// closed when it has exited, while this process is its parent.
func (s *State) start(name string, cmd *exec.Cmd) (done <-chan struct{}, err error) {
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, TagEnv+"=") || strings.HasPrefix(kv, NameEnv+"=")
	}), TagEnv+"="+s.Dir, NameEnv+"="+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := make(chan struct{})
	// Reaped here while `up` runs; afterwards init adopts it.
	go func() { cmd.Wait(); close(c) }()
	// Start returns once the close-on-exec pipe closes, before the kernel has set up the new
	// program's environment: /proc shows none for a moment (a third of QEMU's starts here).
	// Waiting for the tag makes every process start returned one that Leftovers finds.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := tagged(cmd.Process.Pid, s.Dir); ok {
			return c, nil
		}
		select {
		case <-c:
			return c, nil // ended already: nothing to find
		default:
		}
		if time.Now().After(deadline) {
			// Through the handle Start gave (a pidfd), as it cannot be found by its tag.
			cmd.Process.Kill()
			return c, fmt.Errorf("starting %s: its environment shows no lab tag after 5 s (pid %d, stopped)", name, cmd.Process.Pid)
		}
	}
}

// exited says whether pid has finished exiting: no such process, or a zombie. A process
// being killed loses its environment (and so its tag) as the kernel frees its memory, before
// it closes its files: a QEMU that no longer shows as the lab's may still hold its disk
// image's lock, its pidfile's and its forwarded ports, for as long as freeing gigabytes of
// guest memory takes.
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command's name in parentheses, which may hold anything.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st == 'Z' || st == 'X'
}

// tagged reads pid's lab tag: ok when it is a process of the lab in dir. A process that has
// exited (a zombie included: its environment is gone) is not.
func tagged(pid int, dir string) (p Proc, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return Proc{}, false
	}
	p = Proc{PID: pid, Name: "pid " + strconv.Itoa(pid)}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, found := bytes.CutPrefix(kv, []byte(TagEnv+"=")); found {
			ok = string(v) == dir
		} else if v, found := bytes.CutPrefix(kv, []byte(NameEnv+"=")); found {
			p.Name = string(v)
		}
	}
	if !ok {
		return Proc{}, false
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		arg0, _, _ := bytes.Cut(cmdline, []byte{0})
		p.Command = filepath.Base(string(arg0))
	}
	return p, true
}

// Leftovers lists the running processes the lab in dir started, and their children, by their
// tag: lab.json is not read, so a lab whose directory is gone still shows its processes.
func Leftovers(dir string) ([]Proc, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("finding the lab's directory: %w", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		// Never this process: a shell that exported the tag must not make down stop itself.
		if err != nil || pid == os.Getpid() {
			continue
		}
		if p, ok := tagged(pid, dir); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	return out, nil
}

// signalProc sends sig to p if p is still the lab's process. The pidfd is opened before the tag
// is read again: if the tag shows then, the PID has not been given to another program since
// (or the pidfd refers to a process that has exited, and the signal goes nowhere), so a PID
// reused by anything else is never signalled.
func signalProc(p Proc, dir string, sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening a pidfd for %s: %w", p, err)
	}
	defer unix.Close(fd)
	if _, ok := tagged(p.PID, dir); !ok {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("sending %s to %s: %w", sig, p, err)
	}
	return nil
}

// Kill stops every process of the lab in dir, found as Leftovers finds them: SIGTERM (QEMU
// powers its machine off at once), then SIGKILL for what still runs after grace. It returns
// the processes it found.
func Kill(dir string, grace time.Duration) ([]Proc, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("finding the lab's directory: %w", err)
	}
	found, err := Leftovers(dir)
	if err != nil || len(found) == 0 {
		return found, err
	}
	var errs []error
	for _, p := range found {
		errs = append(errs, signalProc(p, dir, syscall.SIGTERM))
	}
	// Children a process starts while it stops are caught by the next Leftovers.
	left, err := waitGone(dir, grace, found)
	if err != nil || len(left) == 0 {
		return found, errors.Join(append(errs, err)...)
	}
	for _, p := range left {
		errs = append(errs, signalProc(p, dir, syscall.SIGKILL))
	}
	// Exiting can take QEMU a moment after SIGKILL: the kernel frees the guest's memory.
	left, err = waitGone(dir, 5*time.Second, found)
	if err == nil && len(left) > 0 {
		err = fmt.Errorf("still running after SIGKILL: %s", list(left))
	}
	return found, errors.Join(append(errs, err)...)
}

// waitGone waits up to timeout for the lab's processes to be gone, those of stopping to have
// finished exiting too, and returns those left.
func waitGone(dir string, timeout time.Duration, stopping []Proc) ([]Proc, error) {
	deadline := time.Now().Add(timeout)
	for {
		left, err := Leftovers(dir)
		for _, p := range stopping {
			if !exited(p.PID) && !slices.ContainsFunc(left, func(l Proc) bool { return l.PID == p.PID }) {
				left = append(left, p)
			}
		}
		if err != nil || len(left) == 0 || !time.Now().Before(deadline) {
			return left, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
