// Package initd is liken's init in the booted system, /sbin/init (PID 1) after the
// initramfs (internal/initramfs) switched into the root image: it mounts the state
// partition, reads the deployment layer, finds this machine's manifest, prepares and
// supervises k3s and the agent, reaps orphans, and shuts down cleanly.
package initd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	apirelease "liken.dev/liken/api/release"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/host/console"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/network"
	"liken.dev/liken/internal/host/watchdog"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/logfile"
	"liken.dev/liken/internal/state"
	"liken.dev/liken/internal/supervisor"
)

// Where the booted system keeps things.
const (
	stateMount = "/var"                   // the state partition
	likenState = "/var/lib/liken"         // liken's own state, the agent's state file
	layerDir   = "/run/liken/layer"       // the unpacked deployment layer (tmpfs: secrets never persist twice)
	rancherDir = "/var/lib/liken/rancher" // bound onto /etc/rancher: k3s config, /etc/rancher/node must persist
)

// system is the booted system's state while init runs it.
type system struct {
	log     io.Writer
	cmd     initramfs.Cmdline
	machine *v1alpha1.Machine
	cluster *v1alpha1.Cluster
	index   *layer.Index
	join    string
	version string
	boot    *bootControl
	// rebootCh receives the agent's reboot requests (through boot).
	rebootCh chan string
	// stateFS is how the state file system was found before it was mounted; stateMounted
	// says it is.
	stateFS      string
	stateMounted bool
	// logs are this boot's log files on the state partition (logs.go); nil before it is
	// mounted, or when they could not be opened.
	logs *logs
	// report is what this boot applied of the boot-time settings (the agent reads it).
	report state.BootReport
	// watchdog is the hardware watchdog init armed as it started (nil without one);
	// watchdogReset says it reset the machine before this boot.
	watchdog      *watchdog.Dog
	watchdogReset bool
}

// Main runs the booted system as PID 1; it never returns.
func Main() {
	if testHelperMain() {
		return
	}
	// Init's lines go to every console the kernel has, not only /dev/console: the screen
	// besides the serial port.
	con := console.New(os.Stdout)
	s, err := systemStage(con, con.FindActive())
	if s != nil && err != nil {
		err = errors.New(s.withDisks(err.Error()))
		if s.boot != nil {
			s.boot.record(func(r *state.BootRecord) { r.End, r.Message = state.EndInitFailed, err.Error() })
		}
		if s.stateMounted {
			s.releaseDisks() // k3s is not running: it had not started, or a shutdown stopped it
		}
	}
	initramfs.Fail(con, err) // a trial reboots into the last good slot
}

func systemStage(console io.Writer, consoles []string) (*system, error) {
	// Init's lines go to the consoles and, once the state partition is mounted, to its log
	// there too (logs.go).
	log := &initLog{console: console}
	version, _ := os.ReadFile(initramfs.VersionFile)
	fmt.Fprintf(log, "liken-init: system stage at %s, release %s\n", initramfs.Uptime(), strings.TrimSpace(string(version)))
	fmt.Fprintf(log, "liken-init: consoles: %s (init's lines on each; /dev/console, the last, also has k3s's and the agent's)\n", strings.Join(consoles, " "))
	cmdlineRaw, _ := os.ReadFile("/proc/cmdline")
	s := &system{log: log, cmd: initramfs.ParseCmdline(string(cmdlineRaw)).WithoutTestSwitches(log), version: strings.TrimSpace(string(version)), rebootCh: make(chan string, 1)}
	s.report.Cmdline = strings.TrimSpace(string(cmdlineRaw))
	fmt.Fprintf(log, "liken-init: booted slot %s (trial %s)\n", s.cmd["liken.slot"], s.cmd["liken.trial"])
	if s.cmd["liken.test"] == "poweroff" && s.cmd["liken.test.stage"] == "system" {
		// Boot tests that stop at the root image.
		fmt.Fprintln(log, "liken-init: test boot complete; powering off")
		unix.Sync()
		return s, unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	if s.cmd["liken.install"] != "" {
		return s, s.installMode()
	}
	// Armed before anything that could hang: on a trial the initramfs armed it already and
	// handed it over, and its timeout runs until init pings it.
	s.armWatchdog()
	go reap()
	for _, step := range []struct {
		name string
		fn   func() error
	}{
		{"mounting the system's filesystems", s.mounts},
		{"recording this boot", s.recordBoot},
		{"preparing the host for k3s", s.hostFiles},
		{"loading the system modules", s.modules},
		{"loading the drivers of the hardware present", s.coldplug},
		{"reading the deployment layer", s.readLayer},
		{"finding this machine's manifest", s.pickMachine},
		{"keeping the logs of the boots before", s.pruneLogs},
		{"loading the machine's kernel modules", s.machineModules},
		{"preparing the data disks", s.dataDisks},
		{"configuring the network", s.network},
		{"setting the clock", s.setClock},
		{"preparing k3s", s.prepareK3s},
		{"checking the host for k3s", s.preflight},
	} {
		if err := step.fn(); err != nil {
			return s, fmt.Errorf("%s: %w", step.name, err)
		}
	}
	return s, s.run()
}

// recordBoot starts this boot's record in the boot log, with what the boot before left
// behind: a panic's log in the firmware's store, a reset by the watchdog.
func (s *system) recordBoot() error {
	s.boot = newBootControl(s.log, s.cmd, s.version, func(why string) {
		select {
		case s.rebootCh <- why:
		default:
		}
	})
	panicLog := readPstore(s.log)
	s.boot.record(func(r *state.BootRecord) {
		r.Slot, r.Trial, r.Version, r.Reached, r.Panic, r.StateFS = s.boot.slot, s.boot.trial, s.version, state.ReachedSystem, panicLog, s.stateFS
		r.Started = s.boot.bootTime
		r.WatchdogReset = s.watchdogReset
	})
	if s.watchdogReset {
		fmt.Fprintln(s.log, "liken-init: the watchdog reset this machine before this boot")
	}
	return nil
}

func (s *system) mounts() error {
	// What k3s, containerd and the kubelet expect of a Linux system besides /var.
	for _, m := range []struct {
		src, dst, fs, data string
		flags              uintptr
		optional           bool
	}{
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", "nsdelegate", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, false}, // Kubernetes 1.35+ refuses cgroup v1
		{"tmpfs", "/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, false},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV, true},
		{"devpts", "/dev/pts", "devpts", "mode=0620,ptmxmode=0666", unix.MS_NOSUID | unix.MS_NOEXEC, true},
		{"mqueue", "/dev/mqueue", "mqueue", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{"bpf", "/sys/fs/bpf", "bpf", "mode=0700", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{"securityfs", "/sys/kernel/security", "securityfs", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			if m.optional {
				fmt.Fprintf(s.log, "liken-init: warning: mounting %s: %v\n", m.dst, err)
				continue
			}
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	// The kubelet propagates volume mounts (CSI, Bidirectional mounts) and needs / shared,
	// as systemd makes it.
	if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making / a shared mount: %w", err)
	}
	dev, err := initramfs.WaitForDevice("PARTLABEL="+disk.State, 60*time.Second)
	if err != nil {
		return err
	}
	if clean, why, err := disk.Ext4Clean(dev, 0); err != nil {
		fmt.Fprintf(s.log, "liken-init: checking the state partition: %v\n", err)
	} else if clean {
		s.stateFS = "clean"
		fmt.Fprintln(s.log, "liken-init: the state partition was cleanly unmounted")
	} else {
		s.stateFS = why
		fmt.Fprintf(s.log, "liken-init: the state partition was not cleanly unmounted: %s\n", why)
	}
	if err := unix.Mount(dev, stateMount, "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mounting the state partition %s: %w", dev, err)
	}
	s.stateMounted = true
	for _, d := range []string{likenState, rancherDir, logDir, "/var/lib/rancher/k3s", "/run/liken"} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	s.openLogs()
	if err := unix.Mount(rancherDir, "/etc/rancher", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s onto /etc/rancher: %w", rancherDir, err)
	}
	fmt.Fprintf(s.log, "liken-init: state partition %s mounted on %s\n", dev, stateMount)
	if readTrim("/sys/module/apparmor/parameters/enabled") == "Y" {
		fmt.Fprintln(s.log, "liken-init: warning: AppArmor is on and the image has no apparmor_parser: pods will fail to start (boot with apparmor=0)")
	} else {
		fmt.Fprintln(s.log, "liken-init: AppArmor off")
	}
	return nil
}

func (s *system) modules() error {
	krel, _ := os.ReadFile(initramfs.KernelRelease)
	return initramfs.LoadModules(s.log, filepath.Join("/lib/modules", strings.TrimSpace(string(krel))), "/etc/liken/system-modules")
}

// readLayer unpacks the layer partition into tmpfs (readLayerPartition), and tells the
// boot control the layer's digest as built, for the Machine's status.
func (s *system) readLayer() error {
	dev, err := initramfs.WaitForDevice("PARTLABEL="+disk.Layer, 30*time.Second)
	if err != nil {
		return err
	}
	f, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer f.Close()
	idx, hdr, err := readLayerPartition(f, layerDir)
	if err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	s.index = idx
	s.boot.setLayer(hdr.BuiltDigest())
	recorded := "no digest recorded (installed before install recorded one)"
	if hdr.Recorded() {
		recorded = "as built " + hdr.BuiltDigest() + ", its bytes as install wrote them"
	}
	fmt.Fprintf(s.log, "liken-init: %s layer unpacked (%d files; %s)\n", idx.Role, len(idx.Files), recorded)
	return nil
}

func (s *system) pickMachine() error {
	cluster, machines, err := layer.ReadManifests(layerDir)
	if err != nil {
		return err
	}
	s.cluster = cluster
	m, how, err := layer.Pick(machines, LocalMACs(), readTrim("/sys/class/dmi/id/product_serial"), s.index.Machine)
	if err != nil {
		return fmt.Errorf("%w; k3s is not started", err)
	}
	s.machine = m
	s.boot.setRole(m.Spec.Role) // the agent holds it against the API's Machine
	s.useStaged()
	if err := unix.Sethostname([]byte(m.Name)); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	if err := writeHosts(hostsFile, m.Name); err != nil {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	// By name, from the layer's Machines as every machine has them, so exactly one server
	// initialises the cluster whatever addresses the servers have (k3s.JoinPlan).
	if s.join, err = k3s.PlanJoin(cluster.Spec, machines).For(m.Name); err != nil {
		return fmt.Errorf("choosing where to join the cluster: %w", err)
	}
	fmt.Fprintf(s.log, "liken-init: this is Machine %s (%s, found by %s)\n", m.Name, m.Spec.Role, how)
	return nil
}

// prepareK3s writes what k3s and the agent need: tokens, the custom CA before k3s's first
// start on a server, the agent's credentials, and k3s's configuration (the same renderer the
// agent uses later).
func (s *system) prepareK3s() error {
	copyIn := func(src, dst string, mode os.FileMode) error {
		b, err := os.ReadFile(filepath.Join(layerDir, src))
		if err != nil {
			return err
		}
		os.MkdirAll(filepath.Dir(dst), 0o700)
		return os.WriteFile(dst, b, mode)
	}
	paths := k3s.DefaultPaths
	if err := copyIn(layer.TokenFile, paths.TokenFile, 0o600); err != nil {
		return err
	}
	if s.machine.Spec.Role == v1alpha1.RoleServer {
		if err := copyIn(layer.AgentTokenFile, paths.AgentTokenFile, 0o600); err != nil {
			return err
		}
		// k3s takes a custom CA only before its first start, and rotation is its own
		// procedure: never overwrite server/tls once it exists.
		tls := filepath.Join(paths.DataDir, "server", "tls")
		if _, err := os.Stat(tls); errors.Is(err, os.ErrNotExist) {
			for _, f := range s.index.Files {
				if rel, ok := strings.CutPrefix(f.Name, layer.TLSDir+"/"); ok {
					if err := copyIn(f.Name, filepath.Join(tls, rel), os.FileMode(f.Mode)); err != nil {
						return err
					}
				}
			}
		}
		manifests := filepath.Join(paths.DataDir, "server", "manifests")
		for _, f := range s.index.Files {
			if rel, ok := strings.CutPrefix(f.Name, layer.K3sManifestsDir+"/"); ok {
				if err := copyIn(f.Name, filepath.Join(manifests, rel), 0o600); err != nil {
					return err
				}
			}
		}
	}
	// The kubelet's node log query, for `liken logs` (logs.go keeps the files it reads).
	dropIn := filepath.Join(paths.DataDir, k3s.KubeletLogsDropIn)
	os.MkdirAll(filepath.Dir(dropIn), 0o700)
	if err := os.WriteFile(dropIn, k3s.KubeletLogsConfig(readTrim("/etc/liken/k3s-version")), 0o600); err != nil {
		return fmt.Errorf("writing the kubelet's log settings: %w", err)
	}
	api := s.apiURL()
	cert, err1 := os.ReadFile(filepath.Join(layerDir, layer.CredentialsDir, s.machine.Name+".crt"))
	key, err2 := os.ReadFile(filepath.Join(layerDir, layer.CredentialsDir, s.machine.Name+".key"))
	ca, err3 := os.ReadFile(filepath.Join(layerDir, layer.TLSDir, "server-ca.crt"))
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("the layer lacks this machine's agent credential: %w", err)
	}
	kc, err := kubeconfig.Render(api, ca, cert, key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(likenState, "agent.kubeconfig"), kc, 0o600); err != nil {
		return err
	}
	if s.machine.Spec.Role == v1alpha1.RoleServer {
		// The bootstrap credential, which only creates the Cluster and Machines when absent.
		cert, err1 := os.ReadFile(filepath.Join(layerDir, layer.BootstrapCert))
		key, err2 := os.ReadFile(filepath.Join(layerDir, layer.BootstrapKey))
		if err := errors.Join(err1, err2); err != nil {
			// A layer installed before bootstrap existed: its cluster is up already, and a
			// release upgrade must not fail its boot for want of it.
			fmt.Fprintf(s.log, "liken-init: the server layer has no bootstrap credential (a layer from before it): no bootstrap\n")
		} else {
			kc, err := kubeconfig.Render(api, ca, cert, key)
			if err != nil {
				return err
			}
			// In tmpfs, as the layer: the key is not kept twice on disk.
			if err := writeFile0600(bootstrapKubeconfig, kc); err != nil {
				return err
			}
		}
	}
	// Registry Secrets live in the API; at boot k3s starts without their credentials and the
	// agent adds them once it reads them.
	var nodeIP string
	if n := s.machine.Spec.Network; n != nil {
		nodeIP = n.NodeIP // this boot's network: the staged one on trial, else the last good
	}
	out, err := k3s.Render(k3s.Input{Role: s.machine.Spec.Role, NodeName: s.machine.Name, NodeIP: nodeIP, Cluster: s.cluster.Spec, Join: s.join, Paths: paths, AllowMissingSecrets: true, SwapOn: k3s.SwapOn()})
	if err != nil {
		return err
	}
	if err := k3s.Root("/").Write(out); err != nil {
		return err
	}
	if standIn() {
		cert, err1 := os.ReadFile(filepath.Join(layerDir, layer.StandInDir, s.machine.Name+".crt"))
		key, err2 := os.ReadFile(filepath.Join(layerDir, layer.StandInDir, s.machine.Name+".key"))
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("this release carries the k3s stand-in but the layer has no node credential for it (liken layer --stand-in-node-credentials): %w", err)
		}
		kc, err := kubeconfig.Render(api, ca, cert, key)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(standInKubeconfig), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(standInKubeconfig, kc, 0o600); err != nil {
			return err
		}
		return writeStandInComponentCredentials(api, ca)
	}
	return nil
}

// writeStandInComponentCredentials writes what a real stand-in node needs beside its node
// kubeconfig (api/release's StandIn* files): kubeconfigs for kube-proxy and flannel and the client
// CA the kubelet checks callers against. A layer from before them has none: the stand-in then
// says what it lacks.
func writeStandInComponentCredentials(api string, ca []byte) error {
	dir := filepath.Dir(standInKubeconfig)
	for comp, name := range map[string]string{"kube-proxy": apirelease.StandInKubeProxyKubeconfig, "k3s-controller": apirelease.StandInControllerKubeconfig} {
		cert, err1 := os.ReadFile(filepath.Join(layerDir, layer.StandInComponentsDir, comp+".crt"))
		key, err2 := os.ReadFile(filepath.Join(layerDir, layer.StandInComponentsDir, comp+".key"))
		if errors.Is(err1, os.ErrNotExist) {
			return nil
		}
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		kc, err := kubeconfig.Render(api, ca, cert, key)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), kc, 0o600); err != nil {
			return err
		}
	}
	clientCA, err := os.ReadFile(filepath.Join(layerDir, layer.TLSDir, "client-ca.crt"))
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, apirelease.StandInClientCA), clientCA, 0o644)
}

const (
	standInKubeconfig   = "/var/lib/liken/stand-in/node.kubeconfig"
	bootstrapKubeconfig = "/run/liken/bootstrap.kubeconfig"
)

// standIn reports whether the root image carries liken's k3s stand-in instead of k3s.
func standIn() bool {
	_, err := os.Stat("/etc/liken/k3s-stand-in")
	return err == nil
}

// apiURL is where the agent reaches the API: a server's own k3s, as k3s's servers reach
// theirs; an agent's the server it joins through; or, in VM tests whose stand-in has no API
// of its own, the test's API server named by liken.test.api.
func (s *system) apiURL() string {
	if u := s.cmd["liken.test.api"]; u != "" {
		return u
	}
	if s.join != "" && s.machine.Spec.Role != v1alpha1.RoleServer {
		return s.join
	}
	return "https://127.0.0.1:" + k3s.APIPort
}

// apiAddresses are the addresses the agent's API connections try in order (its
// --api-addresses): a joining server's own k3s, then the server it joined through, for
// while its own is not running (a failed trial); an agent's k3s load balancer (127.0.0.1,
// k3s's lb-server-port 6444, which fails over between the servers), then the server it
// joined through, for while k3s is not running. None on the first server or in VM tests
// whose API is the test's.
func (s *system) apiAddresses() []string {
	if s.cmd["liken.test.api"] != "" || s.join == "" {
		return nil
	}
	u, err := url.Parse(s.join)
	if err != nil || u.Host == "" {
		return nil
	}
	local := "127.0.0.1:" + k3s.APIPort
	if s.machine.Spec.Role == v1alpha1.RoleAgent {
		local = "127.0.0.1:" + k3s.AgentLBPort
	}
	return []string{local, u.Host}
}

func (s *system) network() error {
	s.report.Network = s.machine.Spec.Network
	var failed []string
	for _, err := range network.Apply(context.Background(), s.machine.Spec.Network, s.machine.Name, s.log) {
		fmt.Fprintf(s.log, "liken-init: network: %v\n", err)
		failed = append(failed, err.Error())
	}
	if len(failed) > 0 && s.machine.Spec.Network != nil {
		s.notApplied("machine.spec.network", strings.Join(failed, "; "))
	}
	s.boot.setReport(s.report)
	return nil
}

// notApplied records in this boot's report that init could not apply all of a field.
func (s *system) notApplied(field, why string) {
	if s.report.NotApplied == nil {
		s.report.NotApplied = map[string]string{}
	}
	s.report.NotApplied[field] = why
}

// run supervises k3s and the agent until a shutdown is asked for, then stops them and
// powers off or reboots.
func (s *system) run() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k3sOut := s.output(logfile.K3s)
	s.restoreEtcd(likenState, k3s.SnapshotDir(k3s.DefaultPaths.DataDir), k3sOut, s.runK3sOnce) // spec.etcdRestore, once, before k3s starts
	s.rejoinEtcd(likenState, k3s.EtcdDir(k3s.DefaultPaths.DataDir), time.Now())                // spec.etcdRejoin, likewise
	k3sProc := supervisor.New(supervisor.Spec{Name: "k3s", Path: "/usr/bin/k3s",
		Args:   []string{string(s.machine.Spec.Role), "--config", k3s.DefaultPaths.Config},
		Env:    k3sEnv(s.cmd, s.machine.Spec.Role, s.version),
		Stdout: k3sOut, Stderr: k3sOut}, nil)
	agentArgs := []string{"--machine", s.machine.Name, "--kubeconfig", filepath.Join(likenState, "agent.kubeconfig"),
		"--state-dir", likenState, "--join", s.join, "--keep-clock", keepClockEvery.String(),
		// The metrics, to the cluster's scrapers through the API server's authentication and
		// authorization (docs/metrics.md).
		"--secure-metrics-addr", fmt.Sprintf(":%d", SecureMetricsPort)}
	if d := s.peerWait(); d > 0 {
		agentArgs = append(agentArgs, "--peer-wait", d.String())
	}
	if a := s.apiAddresses(); len(a) > 0 {
		agentArgs = append(agentArgs, "--api-addresses", strings.Join(a, ","))
	}
	if s.machine.Spec.Role == v1alpha1.RoleServer {
		// Servers take part in the election, and make the Cluster and Machines from the
		// layer where they are absent.
		agentArgs = append(agentArgs, "--coordinator")
		if _, err := os.Stat(bootstrapKubeconfig); err == nil {
			agentArgs = append(agentArgs, "--bootstrap-kubeconfig", bootstrapKubeconfig, "--layer-dir", layerDir)
		}
	}
	agentOut := s.output(logfile.Agent)
	agentProc := supervisor.New(supervisor.Spec{Name: "liken-agent", Path: "/usr/bin/liken-agent",
		Args: agentArgs,
		Env:  []string{"PATH=/usr/bin:/sbin:/bin"}, Stdout: agentOut, Stderr: agentOut}, nil)
	registerSupervised("k3s", k3sProc.PID)
	registerSupervised("liken-agent", agentProc.PID)
	server := &supervisor.Server{Processes: map[string]*supervisor.Process{"k3s": k3sProc}, Boot: s.boot}
	sig := make(chan os.Signal, 1)
	trial := s.boot.trial
	if trial {
		// The boot loader already made the next boot the last good slot; this boot becomes
		// the default only when the agent finds it healthy in time.
		deadline := s.trialDeadline()
		fmt.Fprintf(s.log, "liken-init: trial boot of slot %s; health deadline %s\n", s.boot.slot, deadline)
		go func() {
			select {
			case <-s.boot.committedCh:
			case <-s.boot.failedCh:
			case <-time.After(deadline):
				fmt.Fprintf(s.log, "liken-init: trial of slot %s missed its health deadline; rebooting into the last good slot\n", s.boot.slot)
				msg := s.withDisks(fmt.Sprintf("not found healthy within %s; %s", deadline, reachable(s.apiURL())))
				fmt.Fprintf(s.log, "liken-init: %s\n", msg)
				s.boot.record(func(r *state.BootRecord) { r.End, r.Message = state.EndHealthDeadline, msg })
				sig <- unix.SIGTERM
			}
		}()
	}
	if trial {
		s.injectTrialFault() // VM tests only: liken.test.fail=...
	}
	go server.Serve(ctx, supervisor.DefaultSocket)
	// The agent is stopped before k3s: on a server the API server it reports to is k3s, and
	// its last words (status, Events) need it.
	k3sCtx, stopK3s := context.WithCancel(ctx)
	agentCtx, stopAgent := context.WithCancel(ctx)
	k3sDone, agentDone := make(chan struct{}), make(chan struct{})
	go func() { k3sProc.Run(k3sCtx); close(k3sDone) }()
	go func() { agentProc.Run(agentCtx); close(agentDone) }()
	for k3sProc.PID() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(s.log, "liken-init: started k3s (pid %d) at %s\n", k3sProc.PID(), initramfs.Uptime())
	go s.checkK3sPATH(k3sProc.PID, ctx.Done())
	s.startTestProcesses() // VM tests only: liken.test.trap-sigterm
	s.boot.record(func(r *state.BootRecord) {
		if r.Reached == state.ReachedSystem {
			r.Reached = state.ReachedK3s
		}
	})

	// SIGTERM asks for a reboot, SIGUSR2 for a power-off (as the agent will ask); with
	// ctrl-alt-del disabled the kernel sends SIGINT.
	signal.Notify(sig, unix.SIGTERM, unix.SIGINT, unix.SIGUSR2)
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	action := unix.LINUX_REBOOT_CMD_RESTART
	if s.cmd["liken.test"] == "poweroff" && !trial {
		// Boot tests: run ten seconds (k3s starts slowly under emulation), then shut down cleanly.
		select {
		case <-time.After(10 * time.Second):
		case <-sig:
		}
		action = unix.LINUX_REBOOT_CMD_POWER_OFF
	} else {
		select {
		case why := <-s.rebootCh:
			fmt.Fprintf(s.log, "liken-init: reboot: %s\n", why)
		case got := <-sig:
			if got == unix.SIGUSR2 {
				action = unix.LINUX_REBOOT_CMD_POWER_OFF
			}
		}
	}
	end := state.EndReboot
	if action == unix.LINUX_REBOOT_CMD_POWER_OFF {
		end = state.EndPowerOff
	}
	s.boot.record(func(r *state.BootRecord) {
		if r.End == "" {
			r.End = end
		}
	})
	s.shutdown(stopAgent, agentDone, stopK3s, k3sDone)
	cancel()
	s.watchdog.Disarm()
	fmt.Fprintln(s.log, "liken-init: shutdown complete")
	s.showScreen() // VM tests only (liken.test.screen): what the screen shows now
	return unix.Reboot(action)
}

// SecureMetricsPort is where liken-agent serves its metrics to the cluster (TLS, a bearer
// token the API server accepts, RBAC get on /metrics).
const SecureMetricsPort = 9470

// k3sEnv is k3s's environment for a boot of release version; never INVOCATION_ID, which
// would make k3s pick the systemd cgroup driver.
func k3sEnv(cmd initramfs.Cmdline, role v1alpha1.Role, version string) []string {
	env := []string{"PATH=" + k3s.HostPATH, "HOME=/root"}
	if standIn() {
		env = append(env, "LIKEN_STANDIN_KUBECONFIG="+standInKubeconfig)
		// A server runs the stand-in's control plane, as k3s runs its own, unless a VM test
		// gives an API server of its own.
		if role == v1alpha1.RoleServer && cmd["liken.test.api"] == "" {
			env = append(env, "LIKEN_STANDIN_CONTROL_PLANE="+apirelease.StandInControlPlaneDir)
		}
		// A cluster of its own runs real nodes (containerd, kubelet, kube-proxy, flannel) when
		// the release carries them; a VM test's API server has no controllers to serve a real
		// kubelet, so its machines' Nodes are simulated, as the stand-in's log says, and so
		// are those of VM tests whose point is elsewhere (liken.test.node=simulated), which
		// would pay for the node's start at every boot.
		if _, err := os.Stat(filepath.Join(apirelease.StandInControlPlaneDir, "kubelet")); err == nil && cmd["liken.test.api"] == "" &&
			cmd["liken.test.node"] != "simulated" {
			env = append(env, "LIKEN_STANDIN_NODE="+apirelease.StandInControlPlaneDir)
		}
		if f := standInFaults(cmd, version); f != "" {
			env = append(env, "LIKEN_STANDIN_FAULT="+f) // VM tests: a k3s or a release that goes wrong
		}
	}
	return env
}

// standInFaults are the stand-in's faults for a boot of release version (VM tests, through
// test switches): the machine's own (liken.test.k3s-fault=FAULT), and those of the release
// it boots (liken.test.k3s-fault-release=VERSION:FAULT: that release, and no other, boots
// with FAULT, as a release that breaks something would; the same disk's other slot does
// not), joined by commas.
func standInFaults(cmd initramfs.Cmdline, version string) string {
	var f []string
	if own := cmd["liken.test.k3s-fault"]; own != "" {
		f = append(f, own)
	}
	if v, fault, ok := strings.Cut(cmd["liken.test.k3s-fault-release"], ":"); ok && v == version && fault != "" {
		f = append(f, fault)
	}
	return strings.Join(f, ",")
}

// reaper is reap's state: while any of init's own commands runs (a preflight's modprobe,
// a data disk's mke2fs, the iptables check, shutdown's), reap collects nothing, since a
// child's exit is for the one command that waits for it (before, a reap between a command's
// exit and its wait made the wait fail: "mke2fs: waitid: no child processes", and the disk
// was marked Failed). Orphans wait meanwhile, and are collected once the last hold ends.
var reaper struct {
	mu    sync.Mutex
	held  int
	again chan struct{}
}

func init() { reaper.again = make(chan struct{}, 1) }

// holdReaper keeps reap from collecting any child until release; holds may overlap.
func holdReaper() (release func()) {
	reaper.mu.Lock()
	reaper.held++
	reaper.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			reaper.mu.Lock()
			reaper.held--
			last := reaper.held == 0
			reaper.mu.Unlock()
			if last {
				select {
				case reaper.again <- struct{}{}:
				default:
				}
			}
		})
	}
}

// reap collects orphaned processes reparented to init (exited containerd shims, say), leaving
// its own children to the supervisor that waits for them, and nothing while init's own
// commands run (holdReaper).
func reap() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	for {
		select {
		case <-ch:
		case <-reaper.again:
		}
		reapOrphans()
	}
}

// reapOrphans collects the exited children nobody waits for, unless a hold is on; holding
// reaper.mu throughout, so no hold (and no command of init's) starts halfway.
func reapOrphans() {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if reaper.held > 0 {
		return
	}
	for {
		var info unix.Siginfo
		// Peek at a zombie without collecting it.
		if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
			break
		}
		pid := int(binary.LittleEndian.Uint32(siginfoPid(&info)))
		if pid == 0 || supervised(pid) {
			break
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return string(bytes.TrimSpace(b))
}

func writeFile0600(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o600)
}

// reachable says whether this boot's network reaches the API server the agent reports to:
// what a failed trial of new network settings most often comes down to.
func reachable(api string) string {
	u, err := url.Parse(api)
	if err != nil || u.Host == "" {
		return "the API server's address " + api + " is not a URL"
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	c, err := net.DialTimeout("tcp", host, 3*time.Second)
	if err != nil {
		return fmt.Sprintf("the API server %s is unreachable on this boot's network (%v)", api, err)
	}
	c.Close()
	return fmt.Sprintf("the API server %s was reachable", api)
}
