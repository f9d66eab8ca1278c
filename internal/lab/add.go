package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/qemu"
)

// Add adds an agent to a running lab the way docs/install.md adds a machine to a cluster:
// the layers are built again from the same identity with one more Machine, the server gets
// the newer layer (install --layer-only) and is power-cycled, so that bootstrap makes the
// new Machine (and nothing else: an operator's edits stand), and the new agent's disk is
// installed with the release the Cluster runs now, then booted. It returns once every
// machine is Ready, or fails after timeout.
func Add(ctx context.Context, dir string, out io.Writer, timeout time.Duration) (*Machine, error) {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	st, err := Read(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab in %s: `liken lab up --dir %s` first", dir, dir)
	}
	if err != nil {
		return nil, err
	}
	if st.Private == "" {
		return nil, fmt.Errorf("the lab in %s was made by an older liken that did not record its private network: `liken lab down --dir %s`, then up again", dir, dir)
	}
	server := &st.Machines[0]
	for _, m := range st.Machines {
		if !st.Alive(m.PID) {
			return nil, fmt.Errorf("%s is not running (its QEMU stopped): `liken lab down --dir %s`, then up again", m.Name, dir)
		}
	}

	// What the new agent installs: the release the Cluster runs now, from the lab's channel.
	cfg, err := st.restConfig(20 * time.Second)
	if err != nil {
		return nil, err
	}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	c, err := lc.Cluster(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the lab's Cluster: %w", err)
	}
	version := string(c.Spec.Version)
	pin := string(c.Spec.Releases[version])
	if pin == "" {
		return nil, fmt.Errorf("the Cluster wants release %s, which it does not pin", version)
	}
	// The Cluster the layers carry is the one up wrote: bootstrap makes it only where it is
	// absent, so it matters only to a cluster started again from nothing.
	firstPin := string(c.Spec.Releases[st.Version])
	firstVersion := st.Version
	if firstPin == "" {
		firstVersion, firstPin = version, pin
	}

	n := 1
	for _, m := range st.Machines {
		if m.Role == "agent" {
			n++
		}
	}
	if n > MaxAgents {
		return nil, fmt.Errorf("the lab has %d agents, the most it takes", n-1)
	}
	m := agentMachine(n, Defaults.AgentMiB, Defaults.AgentCPUs)
	for _, o := range st.Machines {
		if o.Role == "agent" {
			m.MemoryMiB, m.CPUs = o.MemoryMiB, o.CPUs // as the lab's other agents
		}
	}
	if m.DemoPort, err = freePort(); err != nil {
		return nil, fmt.Errorf("choosing a port for %s's demo: %w", m.Name, err)
	}
	if free, err := memAvailableMiB(); err == nil && free < m.MemoryMiB+hostHeadroomMiB {
		return nil, fmt.Errorf("%d MiB of memory available; %s needs %d MiB", free, m.Name, m.MemoryMiB)
	}

	manifests := filepath.Join(dir, "manifests")
	machines := append(append([]Machine(nil), st.Machines...), m)
	if err := WriteManifests(manifests, st.ChannelURL, st.ChannelRoot, firstVersion, firstPin, machines); err != nil {
		return nil, err
	}
	docs, err := manifest.Load(manifests)
	if err != nil {
		return nil, err
	}
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(dir, "identity"), OutDir: filepath.Join(dir, "layers"),
		StandInNodeCredentials: true, Server: fmt.Sprintf("https://127.0.0.1:%d", st.APIPort)})
	if err != nil {
		return nil, fmt.Errorf("building the layers again with %s: %w", m.Name, err)
	}
	say("%s added to the manifests in %s, layers built again", m.Name, manifests)

	mdir := filepath.Join(dir, m.Name)
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return nil, err
	}
	m.Disk, m.Console = filepath.Join(mdir, "disk.img"), filepath.Join(mdir, "console.log")
	if _, err := install.Install(ctx, install.Options{Channel: "file://" + filepath.Join(dir, "channel"), Pin: pin, Layer: res.Layers[v1alpha1.RoleAgent],
		LayerDigest: res.Digests[v1alpha1.RoleAgent], Disk: m.Disk, SizeMiB: disk.DefaultLayout.MinSizeMiB() + 1024, Machine: m.Name, Layout: disk.DefaultLayout,
		KernelArgs: qemu.InstallArgs(st.KVM, st.KernelArgs)}); err != nil {
		os.RemoveAll(mdir)
		return nil, fmt.Errorf("installing %s: %w", m.Name, err)
	}
	say("%s's disk installed with release %s", m.Name, version)

	// The server reads its layer at boot: power it off, give it the newer layer, start it.
	say("%s: power cycle, to boot with the newer layer", server.Name)
	if p, ok := tagged(server.PID, dir); ok {
		if err := signalProc(p, dir, syscall.SIGKILL); err != nil {
			return nil, fmt.Errorf("stopping %s: %w", server.Name, err)
		}
	}
	// Until its files are closed too (exited): the new QEMU must have the disk's lock.
	for deadline := time.Now().Add(30 * time.Second); !exited(server.PID); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s's QEMU (pid %d) did not stop", server.Name, server.PID)
		}
	}
	if _, err := install.ReplaceLayer(install.Options{Layer: res.Layers[v1alpha1.RoleServer], LayerDigest: res.Digests[v1alpha1.RoleServer], Disk: server.Disk}); err != nil {
		return nil, fmt.Errorf("giving %s the newer layer: %w", server.Name, err)
	}
	from := map[string]int64{}
	if fi, err := os.Stat(server.Console); err == nil {
		from[server.Name] = fi.Size()
	}
	if err := st.boot(server, st.KVM, st.Private); err != nil {
		return nil, err
	}
	st.Machines = append(st.Machines, m)
	added := &st.Machines[len(st.Machines)-1]
	if err := st.boot(added, st.KVM, st.Private); err != nil {
		return nil, err
	}
	if err := st.save(); err != nil {
		return nil, fmt.Errorf("recording the lab: %w", err)
	}
	say("%s: booting (pid %d); %s: booting (pid %d)", server.Name, server.PID, added.Name, added.PID)
	if err := st.waitReady(ctx, timeout, say, from, nil); err != nil {
		return added, fmt.Errorf("%w; %s's console ends:\n%s", err, added.Name, tail(added.Console, 20))
	}
	say("every machine Ready")
	return added, nil
}
