// Package preflight checks a host for what k3s needs of it before k3s starts: the cgroup v2
// controllers, /dev/kmsg, each module k3s asks modprobe for, every iptables name k3s's PATH
// resolves, and a plausible clock. k3s itself fails late and far from the cause when one is
// missing (a kube-proxy that cannot run iptables, certificates not yet valid); liken's init
// and the k3s stand-in run these checks first and refuse to start k3s, naming the first one
// that fails. docs/k3s.md gives the sources for each.
package preflight

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"liken.dev/liken/internal/host/k3s"
)

// Controllers are the cgroup v2 controllers the kubelet and containerd need enabled for
// the cgroups under the root: cpu and memory (k3s refuses to start without them), cpuset
// and pids (the kubelet's QoS and pod PID limits).
var Controllers = []string{"cpu", "cpuset", "memory", "pids"}

// ModprobeCall is one module k3s loads at start (pkg/agent/syssetup), as `modprobe -- Name`
// through its PATH. k3s only warns when one fails; the preflight fails on the Required ones,
// without which pods get no network.
type ModprobeCall struct {
	Name     string
	Required bool
}

// K3sModprobeCalls are k3s's calls, in its order. nft-expr-counter names no module in
// kernels where the counter expression is part of nf_tables, so it is not required.
var K3sModprobeCalls = []ModprobeCall{
	{"overlay", true}, {"nf_conntrack", true}, {"br_netfilter", true},
	{"iptable_nat", true}, {"iptable_filter", true},
	{"nft-expr-counter", false}, {"nfnetlink-subsys-11", true}, {"nft-chain-2-nat", true},
}

// Host is what the checks look at; DefaultHost is a running Linux system.
type Host struct {
	CgroupDir string // where cgroup v2 is mounted
	Kmsg      string // the kernel log device
	// PATH is the search path k3s runs programs with.
	PATH string
	// NotBefore is the earliest plausible time (the release's build time); zero skips the
	// clock check.
	NotBefore time.Time
	Now       func() time.Time
	// Modprobe runs one modprobe call; nil runs `modprobe -- NAME` found through PATH.
	Modprobe func(name string) error
}

// DefaultHost is this machine, with k3s's PATH given.
func DefaultHost(path string, notBefore time.Time) Host {
	return Host{CgroupDir: "/sys/fs/cgroup", Kmsg: "/dev/kmsg", PATH: path, NotBefore: notBefore, Now: time.Now}
}

// Check is one named check.
type Check struct {
	Name string
	Run  func() error
}

// Checks are the checks, in the order k3s meets what they check; iptables only with
// iptables, since its names resolve only once k3s has unpacked its data directory. A
// modprobe failure k3s tolerates is written to log.
func (h Host) Checks(iptables bool, log io.Writer) []Check {
	checks := []Check{
		{"clock", h.Clock},
		{"cgroup v2 controllers", h.Cgroups},
		{"/dev/kmsg", h.KernelLog},
		{"modprobe", func() error { return h.ModprobeAll(log) }},
	}
	if iptables {
		checks = append(checks, Check{"iptables through PATH", h.Iptables})
	}
	return checks
}

// Run runs checks in order and returns the first failure, naming the check; it logs each.
func Run(checks []Check, log io.Writer, prefix string) error {
	for _, c := range checks {
		if err := c.Run(); err != nil {
			fmt.Fprintf(log, "%s: preflight: %s: FAILED: %v\n", prefix, c.Name, err)
			return fmt.Errorf("preflight %s: %w", c.Name, err)
		}
		fmt.Fprintf(log, "%s: preflight: %s: ok\n", prefix, c.Name)
	}
	fmt.Fprintf(log, "%s: preflight passed (%d checks)\n", prefix, len(checks))
	return nil
}

// Clock fails when the clock is earlier than NotBefore: certificates k3s makes then are not
// yet valid once the clock is right, and those it gets seem not valid yet.
func (h Host) Clock() error {
	if h.NotBefore.IsZero() {
		return nil
	}
	now := h.now()
	if now.Before(h.NotBefore) {
		return fmt.Errorf("the clock reads %s, before this release was built (%s): set the time first", now.UTC().Format(time.RFC3339), h.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

func (h Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Cgroups checks for cgroup v2 with Controllers available and enabled for the cgroups
// below the root.
func (h Host) Cgroups() error {
	avail, err := os.ReadFile(filepath.Join(h.CgroupDir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("no cgroup v2 at %s: %w", h.CgroupDir, err)
	}
	enabled, err := os.ReadFile(filepath.Join(h.CgroupDir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("reading the enabled controllers: %w", err)
	}
	for _, c := range Controllers {
		if !slices.Contains(strings.Fields(string(avail)), c) {
			return fmt.Errorf("the kernel offers no %s controller (cgroup.controllers: %q)", c, strings.TrimSpace(string(avail)))
		}
		if !slices.Contains(strings.Fields(string(enabled)), c) {
			return fmt.Errorf("the %s controller is not enabled below the root (cgroup.subtree_control: %q)", c, strings.TrimSpace(string(enabled)))
		}
	}
	return nil
}

// KernelLog checks that the kernel log device can be read, as the kubelet's OOM watcher
// reads it.
func (h Host) KernelLog() error {
	fi, err := os.Stat(h.Kmsg)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("%s is not a character device (%s)", h.Kmsg, fi.Mode())
	}
	f, err := os.Open(h.Kmsg)
	if err != nil {
		return err
	}
	return f.Close()
}

// ModprobeAll makes k3s's modprobe calls; it fails on the first required one that fails,
// and logs the others' failures.
func (h Host) ModprobeAll(log io.Writer) error {
	run := h.Modprobe
	if run == nil {
		prog, err := LookPath("modprobe", h.PATH)
		if err != nil {
			return fmt.Errorf("k3s finds no modprobe: %w", err)
		}
		run = func(name string) error {
			cmd := exec.Command(prog, "--", name)
			cmd.Env = []string{"PATH=" + h.PATH}
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s -- %s: %w: %s", prog, name, err, bytes.TrimSpace(out))
			}
			return nil
		}
	}
	for _, c := range K3sModprobeCalls {
		if err := run(c.Name); err != nil {
			if c.Required {
				return err
			}
			fmt.Fprintf(log, "modprobe -- %s failed, as k3s tolerates: %v\n", c.Name, err)
		}
	}
	return nil
}

// ErrScript is an iptables name that resolves to a script: with no shell in the image, it
// cannot run.
var ErrScript = errors.New("resolves to a script, and the image has no shell to run it")

// Iptables checks that each of k3s.IptablesNames, looked up through PATH as k3s's children look
// it up, reaches an ELF program.
func (h Host) Iptables() error {
	for _, name := range k3s.IptablesNames {
		p, err := LookPath(name, h.PATH)
		if err != nil {
			return fmt.Errorf("%s: not found through PATH %s", name, h.PATH)
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", name, p, err)
		}
		head := make([]byte, 4)
		f, err := os.Open(real)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		_, err = io.ReadFull(f, head)
		f.Close()
		switch {
		case err != nil:
			return fmt.Errorf("%s: reading %s: %w", name, real, err)
		case bytes.HasPrefix(head, []byte("#!")):
			return fmt.Errorf("%s: %s (%s) %w", name, p, real, ErrScript)
		case !bytes.Equal(head, []byte("\x7fELF")):
			return fmt.Errorf("%s: %s (%s) is not an ELF program", name, p, real)
		}
	}
	return nil
}

// LookPath finds an executable file name in path, as exec.LookPath does with PATH.
func LookPath(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", name, exec.ErrNotFound)
}
