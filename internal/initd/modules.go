package initd

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/kmod"
	"liken.dev/liken/internal/state"
)

// machineModules loads the Machine's kernelModules with their parameters, dependencies
// first, as liken's modprobe does, and writes the parameters where modprobe reads them, so a
// module k3s or the kernel loads later gets them too. A module the image lacks, or one that
// fails to load, is printed, skipped and reported (the agent keeps it pending).
func (s *system) machineModules() error {
	mods := s.machine.Spec.KernelModules
	s.report.KernelModules = mods
	// The kernel runs this modprobe when it wants a module on demand (kernel.modprobe).
	if err := os.WriteFile("/proc/sys/kernel/modprobe", []byte("/sbin/modprobe"), 0o644); err != nil {
		fmt.Fprintf(s.log, "liken-init: kernel.modprobe: %v\n", err)
	}
	options := map[string]string{}
	for _, m := range mods {
		options[kmod.Name(m.Name)] = moduleParams(m.Parameters)
	}
	if err := os.MkdirAll(kmod.OptionsDirs[0], 0o755); err == nil {
		if err := os.WriteFile(filepath.Join(kmod.OptionsDirs[0], "liken.conf"), kmod.OptionsFile(options), 0o644); err != nil {
			fmt.Fprintf(s.log, "liken-init: writing the module parameters for modprobe: %v\n", err)
		}
	}
	if len(mods) == 0 {
		return nil
	}
	var failed []string
	defer func() {
		if len(failed) > 0 {
			s.notApplied("machine.spec.kernelModules", strings.Join(failed, "; "))
		}
	}()
	krel, _ := os.ReadFile(initramfs.KernelRelease)
	ix, err := kmod.OpenIndex(filepath.Join("/lib/modules", strings.TrimSpace(string(krel))))
	if err != nil {
		failed = append(failed, "the image has no module index")
		return err
	}
	for _, m := range mods {
		if _, err := ix.Probe(m.Name, options); err != nil {
			fmt.Fprintf(s.log, "liken-init: kernel module %s: %v\n", m.Name, err)
			failed = append(failed, fmt.Sprintf("%s: %v", m.Name, err))
			continue
		}
		fmt.Fprintf(s.log, "liken-init: kernel module %s loaded %s\n", m.Name, options[kmod.Name(m.Name)])
		s.report.Modules = append(s.report.Modules, strings.TrimSpace(m.Name+" "+options[kmod.Name(m.Name)]))
	}
	return nil
}

func moduleParams(p map[string]v1alpha1.ModuleParameterValue) string {
	var kv []string
	for k, v := range p {
		kv = append(kv, k+"="+string(v))
	}
	sort.Strings(kv)
	return strings.Join(kv, " ")
}

// useStaged takes the settings applied at boot (network, kernel modules, disks) from the spec the
// agent staged last, which is newer than the layer's manifest: a change staged for the next
// boot takes effect at this one. It also applies the sysctls the agent last applied.
func (s *system) useStaged() {
	st, err := state.Store{Dir: likenState}.Load()
	if err != nil || st.Staged == nil || st.Staged.Machine.Role != s.machine.Spec.Role {
		return
	}
	s.machine.Spec.Network, s.machine.Spec.Disks = s.bootSettings(st)
	s.machine.Spec.KernelModules = st.Staged.Machine.KernelModules
	if r := st.Staged.Machine.EtcdRestore; r != nil {
		// The agent's, newer than the layer's; the layer's stands when the agent staged
		// none (a lost quorum: the API was down, and the layer carries the request).
		s.machine.Spec.EtcdRestore = r
	}
	if r := st.Staged.Machine.EtcdRejoin; r != nil {
		s.machine.Spec.EtcdRejoin = r // the same: the agent's, or the layer's
	}
	s.cluster.Spec = clusterAtBoot(s.cluster.Spec, st)
	fmt.Fprintln(s.log, "liken-init: network, kernel modules, disks and the Cluster's settings from the spec the agent staged")
	// The sysctls the agent applied, before k3s starts; the agent keeps the originals.
	if a := st.Applied; a != nil {
		want := sysctl.Merge(a.Cluster.Sysctls, a.Machine.Sysctls)
		originals := map[string]string{}
		for k, v := range st.SysctlOriginals {
			originals[k] = v
		}
		res := sysctl.Default.Apply(want, originals)
		for k, err := range res.Failed {
			fmt.Fprintf(s.log, "liken-init: sysctl %s: %v\n", k, err)
		}
	}
}

// clusterAtBoot is the Cluster spec a boot takes its settings from (k3s's files, swap, time
// servers): the one the agent saw last, not the layer's, which is as old as the machine's
// install. k3s's files rendered from the layer's would differ from the agent's after any
// edit of the registries or k3s's settings, and the agent would restart k3s at every boot.
func clusterAtBoot(layer v1alpha1.ClusterSpec, st *state.State) v1alpha1.ClusterSpec {
	if st == nil || st.Staged == nil {
		return layer
	}
	return *st.Staged.Cluster.DeepCopy()
}

// bootSettings are the network and disks this boot runs with (state.BootSettings).
func (s *system) bootSettings(st *state.State) (*v1alpha1.MachineNetwork, []v1alpha1.Disk) {
	trial, slot := false, ""
	var boots []state.BootRecord
	if s.boot != nil {
		trial, slot = s.boot.trial, s.boot.slot
		var err error
		if boots, err = s.boot.boots.Load(); err != nil {
			fmt.Fprintf(s.log, "liken-init: warning: %v\n", err)
		}
	}
	n, disks, how := st.BootSettings(trial, slot, boots)
	fmt.Fprintf(s.log, "liken-init: network and disks: %s\n", how)
	return n, disks
}

// coldplug loads the drivers of the hardware present, as udev does at boot: every device's
// modalias resolved through the image's modules.alias (kmod.Index.Present), each module
// not in the kernel yet loaded with what it needs. The image carries the drivers of the
// hardware liken supports (release.HardwareModules) without loading them blindly. A driver
// can bring devices of its own (a USB controller's disks): while a pass loads something,
// another looks again a second later, three at most. A driver that fails to load is said
// and skipped: the boot goes on without that device.
func (s *system) coldplug() error {
	start := time.Now()
	krel, _ := os.ReadFile(initramfs.KernelRelease)
	ix, err := kmod.OpenIndex(filepath.Join("/lib/modules", strings.TrimSpace(string(krel))))
	if err != nil {
		fmt.Fprintf(s.log, "liken-init: coldplug: no module index: %v\n", err)
		return nil
	}
	loaded, devices := 0, 0
	tried := map[string]bool{}
	for pass := 0; pass < 3; pass++ {
		if pass > 0 {
			time.Sleep(time.Second)
		}
		devs, err := ix.Present("/sys")
		if err != nil {
			fmt.Fprintf(s.log, "liken-init: coldplug: listing the devices: %v\n", err)
			return nil
		}
		devices = len(devs)
		now := 0
		for _, d := range devs {
			for _, m := range d.Modules {
				if tried[m] || kmod.Loaded("/sys", m) {
					continue
				}
				tried[m] = true
				if _, err := ix.Probe(m, nil); err != nil {
					fmt.Fprintf(s.log, "liken-init: coldplug: %s for %s (%s): %v\n", m, filepath.Base(d.Path), d.Alias, err)
					continue
				}
				now++
				fmt.Fprintf(s.log, "liken-init: coldplug: loaded %s for %s (%s)\n", m, filepath.Base(d.Path), d.Alias)
			}
		}
		loaded += now
		if now == 0 {
			break
		}
	}
	fmt.Fprintf(s.log, "liken-init: coldplug: %d devices, %d drivers loaded in %s\n", devices, loaded, time.Since(start).Round(time.Millisecond))
	return nil
}
