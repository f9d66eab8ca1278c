package initd

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/preflight"
	"liken.dev/liken/internal/state"
)

// What the root image links into the state partition or /run, since it is read-only
// (internal/release writes the links).
const (
	machineIDFile = "/var/lib/liken/machine-id" // /etc/machine-id: stable for the machine's life
	hostsFile     = "/run/liken/hosts"          // /etc/hosts: localhost and this machine's name
)

// hostFiles prepares what k3s, containerd and the kubelet expect of a Linux host besides the
// mounts: the cgroup controllers enabled below the root (k3s enables them only when it is
// PID 1 itself), a machine ID that lasts (cAdvisor reports it), /etc/hosts, and the
// directories the runtime and CNI use.
func (s *system) hostFiles() error {
	// One the kernel cannot enable is only logged: the preflight fails on those k3s needs.
	if err := enableControllers("/sys/fs/cgroup"); err != nil {
		fmt.Fprintf(s.log, "liken-init: warning: %v\n", err)
	}
	id, made, err := machineID(machineIDFile)
	if err != nil {
		return err
	}
	if made {
		fmt.Fprintf(s.log, "liken-init: made this machine's ID %s (kept on the state partition)\n", id)
	}
	for _, d := range []string{"/run/k3s", "/run/netns", "/var/lib/cni"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeHosts writes /etc/hosts once the machine's name is known.
func writeHosts(path, name string) error {
	b := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", name)
	return os.WriteFile(path, []byte(b), 0o644)
}

// enableControllers enables every controller the kernel offers for the cgroups below dir, as
// systemd does; containerd and the kubelet make their cgroups there.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("reading the cgroup controllers: %w", err)
	}
	var errs []error
	for _, c := range strings.Fields(string(avail)) {
		// One at a time: a controller the kernel cannot enable here must not keep the others.
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("enabling the %s controller: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

// machineID reads the machine's ID at path, making it (128 random bits, as systemd's) the
// first time. made says it was made now.
func machineID(path string) (id string, made bool, err error) {
	b, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(b))) == 32 {
		return strings.TrimSpace(string(b)), false, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", false, fmt.Errorf("reading the machine ID: %w", err)
	}
	raw := make([]byte, 16)
	rand.Read(raw)
	raw[6] = raw[6]&0x0f | 0x40 // a version 4 UUID, as systemd-id128 makes
	raw[8] = raw[8]&0x3f | 0x80
	id = hex.EncodeToString(raw)
	if err := atomicfile.Write(path, []byte(id+"\n"), 0o444); err != nil {
		return "", false, fmt.Errorf("writing the machine ID: %w", err)
	}
	return id, true, nil
}

// preflight performs, before k3s starts, the host checks k3s performs, and refuses to start
// it at the first that fails; iptables is checked once k3s has unpacked its data directory
// (checkK3sPATH).
func (s *system) preflight() error {
	built, err := apirelease.ReadBuildTime("/")
	if err != nil {
		return err
	}
	// The checks run modprobe and wait for it: the reaper must not take its exit. Nothing
	// else has started yet whose exit it would miss.
	defer holdReaper()()
	h := preflight.DefaultHost(k3s.HostPATH, built)
	return preflight.Run(h.Checks(false, s.log), s.log, "liken-init")
}

// checkK3sPATH checks, once k3s has unpacked its data directory and run itself from it with
// its own PATH (it then has K3S_DATA_DIR in its environment), that each iptables name
// resolves through that PATH to a program. A release whose k3s bundle lacks one fails
// here, at boot, and not later in kube-proxy: a trial not yet committed goes back to the
// last good slot, and otherwise the Machine's status says so.
func (s *system) checkK3sPATH(pid func() int, stop <-chan struct{}) {
	deadline := time.After(10 * time.Minute)
	for {
		env := processEnv(pid())
		if dir := env["K3S_DATA_DIR"]; dir != "" {
			s.pointCurrentAt(dir)
			if m, err := preflight.LookPath("modprobe", env["PATH"]); err == nil {
				fmt.Fprintf(s.log, "liken-init: k3s's PATH reaches modprobe at %s\n", m)
			}
			release := holdReaper() // it runs iptables and waits for it
			err := preflight.Host{PATH: env["PATH"]}.Iptables()
			release()
			s.report.PreflightDone = true
			if err == nil {
				fmt.Fprintf(s.log, "liken-init: preflight: iptables through k3s's PATH: ok (%s)\n", env["PATH"])
				s.boot.setReport(s.report)
				return
			}
			msg := fmt.Sprintf("k3s's bundle cannot run iptables without a shell: %v", err)
			fmt.Fprintf(s.log, "liken-init: preflight: FAILED: %s\n", msg)
			s.report.PreflightFailed = msg
			s.boot.setReport(s.report)
			select {
			case <-s.boot.committedCh: // a committed trial stays; status says what failed
			default:
				if s.boot.trial {
					s.boot.record(func(r *state.BootRecord) { r.End, r.Message = state.EndInitFailed, msg })
					select {
					case s.rebootCh <- "preflight failed on a trial: " + msg:
					default:
					}
				}
			}
			return
		}
		select {
		case <-stop:
			return
		case <-deadline:
			fmt.Fprintln(s.log, "liken-init: preflight: k3s did not run from its data directory within 10 minutes; iptables not checked")
			s.report.PreflightDone = true
			s.boot.setReport(s.report)
			return
		case <-time.After(time.Second):
		}
	}
}

// pointCurrentAt points k3s's data/current at dir, the data directory the running k3s runs
// from, where liken's iptables links lead. k3s moves data/current only when it unpacks a
// new directory: after a rollback to a k3s unpacked before, it still names the newer one.
func (s *system) pointCurrentAt(dir string) {
	current := filepath.Join(filepath.Dir(dir), "current")
	if t, err := filepath.EvalSymlinks(current); err == nil {
		if d, err := filepath.EvalSymlinks(dir); err == nil && t == d {
			return
		}
	}
	if err := atomicfile.Symlink(dir, current); err != nil {
		fmt.Fprintf(s.log, "liken-init: warning: pointing k3s's data/current at %s: %v\n", dir, err)
		return
	}
	fmt.Fprintf(s.log, "liken-init: k3s's data/current now names %s, the data directory it runs from\n", dir)
}

// processEnv reads a process's environment (empty when it has gone).
func processEnv(pid int) map[string]string {
	env := map[string]string{}
	if pid == 0 {
		return env
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}
