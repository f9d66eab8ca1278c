// Package lab runs a liken cluster of QEMU machines on this host, the way a user would stand
// one up on real machines: a stand-in release built from this source tree and published into
// a local channel, a Cluster and Machines, their deployment layers, installed disk images,
// and machines booted from them on a private network between them, the first server's API
// forwarded to a local port. Everything lives in one directory, recorded in its lab.json; every
// process the lab starts carries the directory in its environment (TagEnv), so `liken lab down`
// stops exactly what `up` started, even when lab.json or the directory is gone, and removes it.
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
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

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
	ChannelURL string `json:"channelURL"`
	ChannelPID int    `json:"channelPID,omitempty"`
	// ChannelRoot is the digest of the lab's signed channel's first root (the Cluster's
	// spec.channelRoot); its keys are in DIR/keys.
	ChannelRoot string    `json:"channelRoot,omitempty"`
	Machines    []Machine `json:"machines"`
	// Private is the machines' private network (a QEMU multicast socket) and KVM whether
	// they run under KVM: what a machine booted later (Add) needs to join them.
	Private string `json:"private,omitempty"`
	KVM     bool   `json:"kvm,omitempty"`
	// KernelArgs are up's --kernel-args, which a machine added later boots with too.
	KernelArgs string `json:"kernelArgs,omitempty"`
}

// Machine is one machine of the lab.
type Machine struct {
	Name       string `json:"name"`
	Role       string `json:"role"`
	MAC        string `json:"mac"`
	PrivateMAC string `json:"privateMAC"`
	IP         string `json:"ip"`
	MemoryMiB  int    `json:"memoryMiB"`
	CPUs       int    `json:"cpus,omitempty"`
	Disk       string `json:"disk"`
	Console    string `json:"console"`
	PID        int    `json:"pid,omitempty"`
	// DemoPort is the host's port QEMU forwards to the machine's DemoNodePort.
	DemoPort int `json:"demoPort,omitempty"`
	// APIPort is the host's port QEMU forwards to a server's API port (6443) in a lab with
	// several servers, behind the lab's load balancer; with one server the lab's API port
	// is forwarded to it directly.
	APIPort int `json:"apiPort,omitempty"`
}

// apiServers are the servers' forwarded API ports the lab's load balancer spreads the lab's
// API port over (none with one server: its port is forwarded directly).
func (s *State) apiServers() []string {
	var out []string
	for _, m := range s.Machines {
		if m.APIPort != 0 {
			out = append(out, fmt.Sprintf("127.0.0.1:%d", m.APIPort))
		}
	}
	return out
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

// Alive reports whether pid is a process of this lab: it runs and carries the lab's tag (so
// a PID the system gave to another program since is never taken for the lab's).
func (s *State) Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, ok := tagged(pid, s.Dir)
	return ok
}

// Running lists the lab's processes still running by name, found by their tag; a child
// carries its parent's name, so the first (lowest PID) of a name is the one given.
func (s *State) Running() map[string]int {
	out := map[string]int{}
	procs, _ := Leftovers(s.Dir)
	for _, p := range procs {
		if _, ok := out[p.Name]; !ok {
			out[p.Name] = p.PID
		}
	}
	return out
}

// restConfig is the lab's admin connection to its API, each request bounded by timeout.
func (s *State) restConfig(timeout time.Duration) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = timeout
	return cfg, nil
}

// vCPUs is m's virtual CPU count: one for a lab written before it was kept.
func (m *Machine) vCPUs() int {
	return max(m.CPUs, 1)
}

// boot starts m's QEMU, its console in a file.
func (s *State) boot(m *Machine, kvm bool, private string) error {
	mach := qemu.Machine{UEFI: true, VarsDir: filepath.Dir(m.Disk), Disks: []qemu.Disk{{Path: m.Disk}}, MemoryMiB: m.MemoryMiB,
		CPUs: m.vCPUs(), KVM: kvm, AllowReboot: true, NICs: []string{m.MAC}, Private: private, PrivateMAC: m.PrivateMAC}
	switch {
	case m.APIPort != 0:
		mach.Forward = []string{fmt.Sprintf("tcp:127.0.0.1:%d-:6443", m.APIPort)}
	case m.Role == "server" && s.Machines[0].Name == m.Name:
		mach.Forward = []string{fmt.Sprintf("tcp:127.0.0.1:%d-:6443", s.APIPort)}
	}
	if m.DemoPort != 0 {
		mach.Forward = append(mach.Forward, fmt.Sprintf("tcp:127.0.0.1:%d-:%d", m.DemoPort, DemoNodePort))
	}
	args, err := mach.Args()
	if err != nil {
		return err
	}
	args = append(args, "-name", "liken-lab-"+m.Name, "-pidfile", filepath.Join(s.Dir, m.Name, "qemu.pid"))
	console, err := os.OpenFile(m.Console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening %s's console: %w", m.Name, err)
	}
	defer console.Close()
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = console, console
	if _, err := s.start(m.Name, cmd); err != nil {
		return err
	}
	m.PID = cmd.Process.Pid
	return nil
}

// Stop stops every process of the lab, found by its tag (Kill), whatever lab.json says.
func (s *State) Stop(grace time.Duration) error {
	_, err := Kill(s.Dir, grace)
	return err
}

// Down stops the lab in dir and removes its directory. The processes are found by their tag,
// so a lab whose lab.json is stale or unreadable, or whose directory is gone, still stops.
func Down(dir string, out io.Writer) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("finding the lab's directory: %w", err)
	}
	dirs := []string{abs}
	// lab.json names the directory up tagged its processes with, should the lab have moved.
	if s, err := Read(dir); err == nil && s.Dir != "" && s.Dir != abs {
		dirs = append(dirs, s.Dir)
	}
	found := false
	for _, d := range dirs {
		procs, err := Leftovers(d)
		if err != nil {
			return err
		}
		for _, p := range procs {
			fmt.Fprintf(out, "stopping %s\n", p)
		}
		// Kill lists them again: one that a process started meanwhile is stopped too.
		more, err := Kill(d, 10*time.Second)
		found = found || len(procs) > 0 || len(more) > 0
		if err != nil {
			return fmt.Errorf("stopping the lab in %s: %w", d, err)
		}
	}
	_, statErr := os.Stat(filepath.Join(abs, StateFile))
	switch {
	case statErr == nil || (found && dirExists(abs)):
		// Without lab.json, a directory its processes were tagged with is still the lab's:
		// up starts only in an empty or new directory.
		if err := os.RemoveAll(abs); err != nil {
			return fmt.Errorf("removing %s: %w", abs, err)
		}
		fmt.Fprintf(out, "removed %s\n", abs)
	case found:
		fmt.Fprintf(out, "%s was already gone\n", abs)
	default:
		return fmt.Errorf("no lab in %s (no %s, and no process of a lab there runs)", dir, StateFile)
	}
	return nil
}

func dirExists(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// consoleHas reports whether a machine's console file holds marker.
func consoleHas(path string, from int64, marker string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return false
	}
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
