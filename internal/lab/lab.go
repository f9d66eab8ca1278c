// Package lab runs a liken cluster of QEMU machines on this host, the way a user would stand
// one up on real machines: a stand-in release built from this source tree and published into
// a local channel, a Cluster and Machines, their deployment layers, installed disk images,
// and machines booted from them on a private network between them, the first server's API
// forwarded to a local port. Everything lives in one directory, recorded in its lab.json, so
// `liken lab down` stops exactly what `up` started and removes it.
package lab

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/qemu"
)

// StateFile records a lab in its directory.
const StateFile = "lab.json"

// State is what `up` started.
type State struct {
	Dir     string    `json:"dir"`
	Started time.Time `json:"started"`
	Version string    `json:"version"`
	// Source is liken's source tree the lab's releases are built from.
	Source     string `json:"source"`
	APIPort    int    `json:"apiPort"`
	Kubeconfig string `json:"kubeconfig"`
	// ChannelURL is the channel as the machines reach it; ChannelPID serves it.
	ChannelURL string    `json:"channelURL"`
	ChannelPID int       `json:"channelPID,omitempty"`
	Machines   []Machine `json:"machines"`
}

// Machine is one machine of the lab.
type Machine struct {
	Name       string `json:"name"`
	Role       string `json:"role"`
	MAC        string `json:"mac"`
	PrivateMAC string `json:"privateMAC"`
	IP         string `json:"ip"`
	MemoryMiB  int    `json:"memoryMiB"`
	Disk       string `json:"disk"`
	Console    string `json:"console"`
	PID        int    `json:"pid,omitempty"`
}

// Read reads the lab in dir.
func Read(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, StateFile), err)
	}
	return &s, nil
}

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.Dir, StateFile), append(b, '\n'), 0o644)
}

// Alive reports whether pid is a process of this lab: it runs, and its command line names
// the lab's directory (so a PID the system gave to another program since is never touched).
func (s *State) Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), s.Dir)
}

// Running lists the lab's processes still running, by what they are.
func (s *State) Running() map[string]int {
	out := map[string]int{}
	for _, m := range s.Machines {
		if s.Alive(m.PID) {
			out[m.Name] = m.PID
		}
	}
	if s.Alive(s.ChannelPID) {
		out["channel server"] = s.ChannelPID
	}
	return out
}

// boot starts m's QEMU detached from this process (its own session, its console in a file),
// so the machine outlives `liken lab up`.
func (s *State) boot(m *Machine, kvm bool, private string) error {
	mach := qemu.Machine{UEFI: true, VarsDir: filepath.Dir(m.Disk), Disks: []qemu.Disk{{Path: m.Disk}}, MemoryMiB: m.MemoryMiB,
		CPUs: 1, KVM: kvm, AllowReboot: true, NICs: []string{m.MAC}, Private: private, PrivateMAC: m.PrivateMAC}
	if m.Role == "server" && s.Machines[0].Name == m.Name {
		mach.Forward = []string{fmt.Sprintf("tcp:127.0.0.1:%d-:6443", s.APIPort)}
	}
	args, err := mach.Args()
	if err != nil {
		return err
	}
	// The disk's path, in the lab's directory, marks the process as the lab's (Alive).
	args = append(args, "-name", "liken-lab-"+m.Name, "-pidfile", filepath.Join(s.Dir, m.Name, "qemu.pid"))
	console, err := os.OpenFile(m.Console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer console.Close()
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", m.Name, err)
	}
	m.PID = cmd.Process.Pid
	go cmd.Wait() // reaped here while `up` runs; afterwards init adopts it
	return nil
}

// Stop stops every process of the lab: SIGTERM (QEMU powers the machine off at once), then
// SIGKILL for what still runs after grace.
func (s *State) Stop(grace time.Duration) error {
	running := s.Running()
	for _, pid := range running {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for len(running) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		running = s.Running()
	}
	for _, pid := range running {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	if left := s.Running(); len(left) > 0 {
		return fmt.Errorf("still running after SIGKILL: %v", left)
	}
	return nil
}

// Down stops the lab in dir and removes its directory.
func Down(dir string, out io.Writer) error {
	s, err := Read(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no lab in %s (no %s)", dir, StateFile)
	}
	if err != nil {
		return err
	}
	for name, pid := range s.Running() {
		fmt.Fprintf(out, "stopping %s (pid %d)\n", name, pid)
	}
	if err := s.Stop(10 * time.Second); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	fmt.Fprintf(out, "removed %s\n", dir)
	return nil
}

// consoleHas reports whether a machine's console file holds marker.
func consoleHas(path, marker string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), marker) {
			return true
		}
	}
	return false
}

// portFree reports whether a TCP port on loopback can be listened on.
func portFree(port int) error {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	return l.Close()
}

// memAvailableMiB is MemAvailable from /proc/meminfo.
func memAvailableMiB() (int, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return kb / 1024, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}
