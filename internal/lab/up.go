package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/qemu"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// Options are `liken lab up`'s inputs.
type Options struct {
	Dir     string
	Servers int // 1, 3 or 5: etcd's quorum needs an odd number (see check)
	Agents  int
	// ServerMiB and AgentMiB are each machine's memory.
	ServerMiB, AgentMiB int
	// ServerCPUs and AgentCPUs are each machine's virtual CPUs.
	ServerCPUs, AgentCPUs int
	APIPort               int
	// Source is liken's source tree the release is built from.
	Source string
	// Version is the release's version.
	Version string
	// Accel is "auto" (KVM where it boots a kernel, else software emulation), "kvm" or "tcg".
	Accel string
	// ChannelServer is the command that serves the channel directory (given as its last two
	// arguments: the directory and the port) in the background: the liken binary itself.
	ChannelServer []string
	// Timeout bounds the wait for every machine to be Ready.
	Timeout time.Duration
	// KernelArgs are extra kernel arguments for every boot of every machine, as `liken
	// install --kernel-args` writes them (a slow host's longer trial deadline, say).
	KernelArgs string
	Out        io.Writer
}

// Defaults fit a 2-core, 8 GiB machine. A server gets two virtual CPUs and an agent one, as
// k3s's requirements recommend for a server and allow for an agent: a server runs the
// control plane beside its node, and with one CPU under software emulation its API server
// took three minutes to start beside another test.
var Defaults = Options{Servers: 1, Agents: 1, ServerMiB: 2048, AgentMiB: 1024, ServerCPUs: 2, AgentCPUs: 1, APIPort: 6443, Version: "2026.12.01-001", Accel: "auto", Timeout: 15 * time.Minute}

// check refuses what cannot work before anything is started or written.
func (o *Options) check() error {
	if err := CheckServers(o.Servers); err != nil {
		return err
	}
	if o.Agents < 0 || o.Agents > MaxAgents {
		return fmt.Errorf("--agents %d: give 0 to %d", o.Agents, MaxAgents)
	}
	if o.Accel != "auto" && o.Accel != "kvm" && o.Accel != "tcg" {
		return fmt.Errorf("--accel %q: give auto, kvm or tcg", o.Accel)
	}
	if !apirelease.ValidVersion(o.Version) {
		return fmt.Errorf("--version %q is not of the form 2026.07.20-001", o.Version)
	}
	if err := bootloader.CheckInstallArgs(o.KernelArgs); err != nil {
		return err
	}
	if s, err := Read(o.Dir); err == nil {
		if running := s.Running(); len(running) > 0 {
			return fmt.Errorf("a lab is already up in %s (%d processes running): see `liken lab status`, or stop it with `liken lab down`", o.Dir, len(running))
		}
		return fmt.Errorf("%s holds a lab that is not running: remove it with `liken lab down --dir %s` first", o.Dir, o.Dir)
	}
	// A lab whose directory was removed while its machines ran: a new one there would share
	// their tag, and their ports.
	left, err := Leftovers(o.Dir)
	if err != nil {
		return fmt.Errorf("looking for processes of an earlier lab in %s: %w", o.Dir, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("processes of an earlier lab in %s still run (%s): stop them with `liken lab down --dir %s`", o.Dir, list(left), o.Dir)
	}
	if entries, err := os.ReadDir(o.Dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty and holds no lab: give another --dir", o.Dir)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return errors.New("qemu-system-x86_64 is missing: install the Debian package qemu-system-x86 (make deps does)")
	}
	for _, f := range []string{qemu.OVMFCode, qemu.OVMFVars} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("UEFI firmware %s is missing: install the Debian package ovmf (make deps does)", f)
		}
	}
	need := o.ServerMiB*o.Servers + o.AgentMiB*o.Agents
	if avail, err := memAvailableMiB(); err == nil && avail < need+hostHeadroomMiB {
		return fmt.Errorf("the lab's machines need %d MiB of memory and this host has %d MiB available: give fewer --agents or less --server-memory/--agent-memory", need, avail)
	}
	if o.ServerMiB < 1536 {
		return fmt.Errorf("--server-memory %d: a server runs etcd and the control plane and needs at least 1536 MiB", o.ServerMiB)
	}
	if o.ServerCPUs < 1 || o.AgentCPUs < 1 {
		return fmt.Errorf("--server-cpus %d, --agent-cpus %d: every machine needs at least one CPU", o.ServerCPUs, o.AgentCPUs)
	}
	if o.AgentMiB < 512 {
		return fmt.Errorf("--agent-memory %d: an agent needs at least 512 MiB", o.AgentMiB)
	}
	if err := portFree(o.APIPort); err != nil {
		return fmt.Errorf("the API port %d is in use on this host (%v): give another with --api-port", o.APIPort, err)
	}
	return nil
}

// CheckServers refuses a number of servers a lab does not stand up: etcd keeps a quorum of a
// majority of its members, so an even number keeps going through no more failures than one
// fewer (two servers through none: docs.k3s.io's HA guide asks for an odd number), and more
// than five takes more of this host than a lab should.
func CheckServers(n int) error {
	if n < 1 || n > MaxServers || n%2 == 0 {
		return fmt.Errorf("--servers %d: give 1, 3 or 5 (etcd's quorum is a majority of the servers, so an even number tolerates no more servers down than one fewer)", n)
	}
	return nil
}

// MaxServers is the most servers a lab has.
const MaxServers = 5

// MaxAgents is the most agents a lab has, from up or add.
const MaxAgents = 8

// hostHeadroomMiB is the memory the host keeps beyond the lab's machines.
const hostHeadroomMiB = 512

// Up stands a lab up, or leaves nothing behind.
func Up(ctx context.Context, o Options) (st *State, err error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(o.Out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	st = &State{Dir: dir, Started: start.UTC(), Version: o.Version, Source: o.Source, APIPort: o.APIPort, KernelArgs: o.KernelArgs}
	defer func() {
		if err != nil {
			err = st.abandon(err)
		}
	}()
	// lab.json from the start: should up itself be killed, the directory says it is a lab's,
	// for `up` to refuse and `down` to remove.
	if err := st.save(); err != nil {
		return st, fmt.Errorf("recording the lab: %w", err)
	}

	// The release, into the lab's channel.
	say("building the stand-in release %s from %s", o.Version, o.Source)
	relDir := filepath.Join(dir, "release", o.Version)
	if _, _, err := release.DefaultCache().Build(ReleaseOptions(o.Version, o.Source, relDir, o.Out)); err != nil {
		return st, fmt.Errorf("building the release: %w", err)
	}
	// The lab's channel is signed, as a fleet's should be (docs/upgrade.md): its keys in
	// DIR/keys, its root in the Cluster, so the machines write only what they signed.
	channel := filepath.Join(dir, "channel")
	repo := &tuf.Repo{Channel: channel, Expiry: tuf.DefaultExpiry}
	if st.ChannelRoot, err = repo.Init(tuf.InitOptions{KeyDir: filepath.Join(dir, "keys")}); err != nil {
		return st, fmt.Errorf("signing the lab's channel: %w", err)
	}
	if err := st.save(); err != nil {
		return st, fmt.Errorf("recording the lab: %w", err)
	}
	pin, err := publishSigned(st, relDir)
	if err != nil {
		return st, err
	}
	say("release built and published into %s (%s), signed by the channel's keys in %s (root %s)", channel, pin, filepath.Join(dir, "keys"), st.ChannelRoot)
	images := filepath.Join(dir, "registry")
	if err := buildDemo(o.Source, images, time.Unix(1785000000, 0)); err != nil {
		return st, err
	}
	say("the demo workload's image %s built into %s", DemoImage, images)
	kvm := o.Accel == "kvm"
	if o.Accel == "auto" {
		var why string
		// Under KVM the kernel's banner comes within a second of QEMU's start; where nested
		// virtualisation hangs, the whole bound is waited out (20 s until December 2026).
		kvm, why = qemu.ProbeKVM(ctx, filepath.Join(relDir, "vmlinuz"), 10*time.Second)
		if kvm {
			say("%s: the machines use KVM", why)
		} else {
			say("%s: the machines run in software emulation (TCG), several times slower", why)
		}
	}

	// The Cluster, the Machines and their layers.
	chPort := 20000 + rand.IntN(10000)
	st.ChannelURL = fmt.Sprintf("http://10.0.2.2:%d/", chPort)
	private := fmt.Sprintf("230.0.0.1:%d", 20000+rand.IntN(10000))
	st.Private, st.KVM = private, kvm
	for i := range o.Servers {
		st.Machines = append(st.Machines, Machine{Name: fmt.Sprintf("lab-server-%d", i+1), Role: "server", MAC: fmt.Sprintf("52:54:00:12:34:%02x", 1+i),
			PrivateMAC: fmt.Sprintf("52:54:00:76:00:%02x", 0x10+i), IP: fmt.Sprintf("192.168.76.%d", 10+i), MemoryMiB: o.ServerMiB, CPUs: o.ServerCPUs})
	}
	for i := range o.Agents {
		st.Machines = append(st.Machines, agentMachine(i+1, o.AgentMiB, o.AgentCPUs))
	}
	for i := range st.Machines {
		m := &st.Machines[i]
		if m.DemoPort, err = freePort(); err != nil {
			return st, fmt.Errorf("choosing a port for %s's demo: %w", m.Name, err)
		}
		// With several servers the lab's API port is a load balancer (the channel server
		// runs it) in front of each server's own forwarded port.
		if m.Role == "server" && o.Servers > 1 {
			if m.APIPort, err = freePort(); err != nil {
				return st, fmt.Errorf("choosing a port for %s's API: %w", m.Name, err)
			}
		}
	}
	if o.Servers > 1 && len(o.ChannelServer) == 0 {
		return st, errors.New("a lab with several servers needs its channel server, which runs the API's load balancer")
	}
	manifests := filepath.Join(dir, "manifests")
	if err := WriteManifests(manifests, st.ChannelURL, st.ChannelRoot, st.Version, pin, st.Machines); err != nil {
		return st, err
	}
	docs, err := manifest.Load(manifests)
	if err != nil {
		return st, err
	}
	layers := filepath.Join(dir, "layers")
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(dir, "identity"), OutDir: layers,
		StandInNodeCredentials: true, Server: fmt.Sprintf("https://127.0.0.1:%d", o.APIPort)})
	if err != nil {
		return st, err
	}
	st.Kubeconfig = res.Kubeconfig
	say("Cluster and %d Machines written to %s, layers built", len(st.Machines), manifests)

	// Disks, then the machines.
	for i := range st.Machines {
		m := &st.Machines[i]
		mdir := filepath.Join(dir, m.Name)
		if err := os.MkdirAll(mdir, 0o755); err != nil {
			return st, err
		}
		m.Disk, m.Console = filepath.Join(mdir, "disk.img"), filepath.Join(mdir, "console.log")
		// Sparse: only what is written takes room on the host.
		size := disk.DefaultLayout.MinSizeMiB() + 1024
		if _, err := install.Install(ctx, install.Options{Channel: "file://" + channel, Pin: pin, Layer: res.Layers[v1alpha1.Role(m.Role)],
			LayerDigest: res.Digests[v1alpha1.Role(m.Role)], Disk: m.Disk, SizeMiB: size, Machine: m.Name, Layout: disk.DefaultLayout, KernelArgs: qemu.InstallArgs(kvm, o.KernelArgs)}); err != nil {
			return st, fmt.Errorf("installing %s: %w", m.Name, err)
		}
	}
	say("disks installed")
	// Interrupted while building or installing: start nothing.
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if len(o.ChannelServer) > 0 {
		args := append(o.ChannelServer[1:], "--images", images)
		if servers := st.apiServers(); len(servers) > 0 {
			args = append(args, "--api", fmt.Sprintf("127.0.0.1:%d", o.APIPort), "--api-servers", strings.Join(servers, ","))
		}
		cmd := exec.Command(o.ChannelServer[0], append(args, channel, fmt.Sprint(chPort))...)
		logf, err := os.Create(filepath.Join(dir, "channel.log"))
		if err != nil {
			return st, err
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		_, err = st.start("channel server", cmd)
		logf.Close()
		if err != nil {
			return st, err
		}
		st.ChannelPID = cmd.Process.Pid
		if err := st.save(); err != nil {
			return st, fmt.Errorf("recording the lab: %w", err)
		}
		say("channel served to the machines at %s (pid %d)", st.ChannelURL, st.ChannelPID)
		if servers := st.apiServers(); len(servers) > 0 {
			say("the API at https://127.0.0.1:%d: a load balancer in the channel server (pid %d) over the %d servers' forwarded ports %s, which closes a failed server's connections and sends new ones to another", o.APIPort, st.ChannelPID, len(servers), strings.Join(servers, ", "))
		}
	}
	for i := range st.Machines {
		m := &st.Machines[i]
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := st.boot(m, kvm, private); err != nil {
			return st, err
		}
		if err := st.save(); err != nil {
			return st, fmt.Errorf("recording the lab: %w", err)
		}
		say("%s: booting (pid %d, %d MiB, %d vCPU, console %s)", m.Name, m.PID, m.MemoryMiB, m.vCPUs(), m.Console)
	}
	// The demo is deployed once every Node is Ready and takes pods (its scheduler then
	// spreads the two pods over the machines), not once every Machine is: its image is pulled and its pods start
	// while the servers' bootstrap makes the Machines and their agents report, which took
	// 100 s of up beside the VM tier's other tests (December 2026).
	var deployed error = errors.New("not deployed")
	nodesReady := func() { deployed = st.deployDemo(ctx, say) }
	if err := st.waitReady(ctx, o.Timeout, say, nil, nodesReady); err != nil {
		for _, m := range st.Machines {
			say("%s's console ends:\n%s", m.Name, tail(m.Console, 20))
		}
		return st, err
	}
	say("every machine Ready")
	if deployed != nil {
		return st, deployed
	}
	if err := st.awaitDemo(ctx, say); err != nil {
		return st, err
	}
	return st, nil
}

// deployDemo writes the demo's manifest into the lab's directory and applies it.
func (s *State) deployDemo(ctx context.Context, say func(string, ...any)) error {
	client, err := s.clientset(20 * time.Second)
	if err != nil {
		return err
	}
	m, err := DemoManifest()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "demo.yaml"), m, 0o644); err != nil {
		return err
	}
	if err := kube.Retry(ctx, time.Minute, func(ctx context.Context) error { return deployDemo(ctx, client) }); err != nil {
		return fmt.Errorf("deploying the demo: %w", err)
	}
	say("the demo deployed (%s): Deployment, PodDisruptionBudget and NodePort Service %s, its image pulled from the lab's registry", filepath.Join(s.Dir, "demo.yaml"), DemoName)
	return nil
}

// awaitDemo waits until the deployed demo answers on the machines.
func (s *State) awaitDemo(ctx context.Context, say func(string, ...any)) error {
	client, err := s.clientset(20 * time.Second)
	if err != nil {
		return err
	}
	// Alone on a 2-core host without KVM the demo answered on both machines within a minute
	// of being deployed; beside the VM tier's other machines, the agent's after 4.5 minutes
	// (December 2026, the server's Node Ready only at 11 minutes).
	if _, err := s.waitDemo(ctx, client, 10*time.Minute, say); err != nil {
		return fmt.Errorf("%w; the demo's pods: %s", err, demoPods(ctx, client))
	}
	return nil
}

// clientset is a client of the lab's API with the given request timeout.
func (s *State) clientset(timeout time.Duration) (*kubernetes.Clientset, error) {
	cfg, err := s.restConfig(timeout)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// abandon is up's failure path: it stops every process the lab started, found by their tag
// (so one started before up recorded it too), and removes the directory. When a process
// survives, the directory stays, for `up` to refuse and `down` to try again.
func (s *State) abandon(err error) error {
	if serr := s.Stop(10 * time.Second); serr != nil {
		return fmt.Errorf("%w; stopping what up started: %v (`liken lab down --dir %s` tries again)", err, serr, s.Dir)
	}
	if rerr := os.RemoveAll(s.Dir); rerr != nil {
		return fmt.Errorf("%w; removing %s: %v", err, s.Dir, rerr)
	}
	return err
}

// stages a machine goes through, in order, as up shows them.
var stages = []string{"booting", "k3s started", "Node Ready", "Machine Ready"}

// waitReady waits until every machine is Ready, showing each one's stages as it reaches
// them. from gives, for a machine booted again, where its console's new boot begins (what
// came before is the last boot's). nodesReady, when set, is called once, as soon as every
// machine's Node is Ready by this boot and takes pods (no NoSchedule taint left).
func (s *State) waitReady(ctx context.Context, timeout time.Duration, say func(string, ...any), from map[string]int64, nodesReady func()) error {
	cfg, err := s.restConfig(10 * time.Second)
	if err != nil {
		return err
	}
	// Not NewForConfigOrDie: a panic would skip up's failure path and leave the machines.
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("a client for the lab's API: %w", err)
	}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return err
	}
	at := map[string]int{}
	deadline := time.Now().Add(timeout)
	for {
		done, nodes := 0, 0
		for _, m := range s.Machines {
			if !s.Alive(m.PID) {
				return fmt.Errorf("%s's QEMU stopped (console %s, which ends:\n%s\n)", m.Name, m.Console, tail(m.Console, 20))
			}
			stage := 0
			if consoleHas(m.Console, from[m.Name], "liken-init: started k3s") {
				stage = 1
			}
			// A Node still Ready from before a power cycle says nothing of this boot.
			if n, err := kc.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{}); stage == 1 && err == nil && kube.NodeReady(n) {
				stage = 2
				if schedulable(n) {
					nodes++
				}
				if mm, err := lc.Machine(ctx, m.Name); err == nil && meta.IsStatusConditionTrue(mm.Status.Conditions, v1alpha1.MachineReady) {
					stage = 3
				}
			}
			for at[m.Name] < stage {
				at[m.Name]++
				say("%s: %s", m.Name, stages[at[m.Name]])
			}
			if at[m.Name] == len(stages)-1 {
				done++
			}
		}
		if nodesReady != nil && nodes == len(s.Machines) {
			nodesReady()
			nodesReady = nil
		}
		// Every Machine Ready is not every Node taking pods: on a starved server the
		// controller manager lifts its not-ready taint after its Machine is Ready (ci30, the
		// demo then was never deployed). What waits for the Nodes waits on.
		if done == len(s.Machines) && nodesReady == nil {
			return nil
		}
		if time.Now().After(deadline) {
			if done == len(s.Machines) {
				return fmt.Errorf("every machine was Ready, but not every Node took pods after %s (still tainted or cordoned: kubectl describe nodes)", timeout)
			}
			return fmt.Errorf("not every machine was Ready after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// schedulable: the scheduler may place pods on the Node now. Ready is not enough: the
// controller manager takes its not-ready taint off a moment later (much later on a starved
// server), and pods deployed before go all to the other machines (December 2026).
func schedulable(n *corev1.Node) bool {
	if n.Spec.Unschedulable {
		return false
	}
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			return false
		}
	}
	return true
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

const clusterYAML = `# The lab's Cluster: edit it with kubectl (liken lab up printed the kubeconfig).
apiVersion: liken.dev/v1alpha1
kind: Cluster
metadata:
  name: liken
spec:
  channel: %s
  # The channel's signed root: machines write only releases its keys signed.
  %s
  releases:
    %q: %s
  version: %q
  rebootPolicy: Manual
  disruptionBudget:
    maxUnavailable: 1
  kernelArgs: ["console=ttyS0,115200"]
  # The demo's image, from the registry the lab's channel server runs on the host.
  registries:
    mirrors:
      - registry: %s
        endpoints: [%q]
`

// Each machine: a private network (static, the one the cluster uses: its node IP) and QEMU's
// user network (DHCP, for the channel the host serves).
const machineYAML = `apiVersion: liken.dev/v1alpha1
kind: Machine
metadata:
  name: %[1]s
spec:
  role: %[2]s
  match:
    macs: ["%[3]s"]
  network:
    interfaces:
      - name: eth1
        mac: "%[4]s"
        addresses: ["%[5]s/24"]
      - name: eth0
        mac: "%[3]s"
        dhcp: true
    # k3s's node-ip: every lab machine has the same address on QEMU's user network, the
    # default route's, which k3s would otherwise take.
    nodeIP: "%[5]s"
`

// agentMachine is the lab's agent number n (from 1): its name, addresses, memory and CPUs.
func agentMachine(n, memoryMiB, cpus int) Machine {
	return Machine{Name: fmt.Sprintf("lab-agent-%d", n), Role: "agent", MAC: fmt.Sprintf("52:54:00:12:34:%02x", 0x20+n-1),
		PrivateMAC: fmt.Sprintf("52:54:00:76:00:%02x", 0x20+n-1), IP: fmt.Sprintf("192.168.76.%d", 20+n-1), MemoryMiB: memoryMiB, CPUs: cpus}
}

// WriteManifests writes a lab's Cluster (channel and its root, one release pinned and wanted) and its
// Machines into dir, as `liken lab up` does; the VM tests stand clusters up from them too.
func WriteManifests(dir, channelURL, channelRoot, version, pin string, machines []Machine) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// A lab made before its channel was signed (no root recorded) says so, as an operator
	// must: without either line its machines would write no release.
	root := "insecureUnsignedChannel: true"
	if channelRoot != "" {
		root = "channelRoot: " + channelRoot
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), fmt.Appendf(nil, clusterYAML, channelURL, root, version, pin, version, DemoRegistry, strings.TrimSuffix(channelURL, "/")), 0o644); err != nil {
		return err
	}
	for _, m := range machines {
		if err := os.WriteFile(filepath.Join(dir, m.Name+".yaml"), fmt.Appendf(nil, machineYAML, m.Name, m.Role, m.MAC, m.PrivateMAC, m.IP), 0o644); err != nil {
			return err
		}
	}
	return nil
}
