package initd

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/sysctl"
	"liken.dev/liken/internal/initramfs"
	"liken.dev/liken/internal/kmod"
	"liken.dev/liken/internal/state"
)

// machineModules loads the Machine's kernelModules with their parameters, dependencies
// first. A module the image lacks, or one that fails to load, is printed and skipped: the
// agent reports modules that are not loaded.
func (s *system) machineModules() error {
	mods := s.machine.Spec.KernelModules
	s.report.KernelModules = mods
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
	dir := filepath.Join("/lib/modules", strings.TrimSpace(string(krel)))
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		failed = append(failed, "the image has no module index")
		return fmt.Errorf("reading the module index: %w", err)
	}
	deps, err := kmod.ParseDeps(f)
	f.Close()
	if err != nil {
		return err
	}
	for _, m := range mods {
		order, err := deps.Resolve(m.Name)
		if err != nil {
			fmt.Fprintf(s.log, "liken-init: kernel module %s: %v\n", m.Name, err)
			failed = append(failed, fmt.Sprintf("%s: %v", m.Name, err))
			continue
		}
		ok := true
		for i, file := range order {
			params := ""
			if i == len(order)-1 {
				params = moduleParams(m.Parameters)
			}
			if err := kmod.Load(dir, file, params); err != nil {
				fmt.Fprintf(s.log, "liken-init: kernel module %s: %v\n", m.Name, err)
				failed = append(failed, fmt.Sprintf("%s: %v", m.Name, err))
				ok = false
				break
			}
		}
		if ok {
			fmt.Fprintf(s.log, "liken-init: kernel module %s loaded %s\n", m.Name, moduleParams(m.Parameters))
			s.report.Modules = append(s.report.Modules, strings.TrimSpace(m.Name+" "+moduleParams(m.Parameters)))
		}
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

// useStaged takes the settings applied at boot (network, kernel modules) from the spec the
// agent staged last, which is newer than the layer's manifest: a change staged for the next
// boot takes effect at this one. It also applies the sysctls the agent last applied.
func (s *system) useStaged() {
	st, err := state.Store{Dir: likenState}.Load()
	if err != nil || st.Staged == nil || st.Staged.Machine.Role != s.machine.Spec.Role {
		return
	}
	s.machine.Spec.Network = st.Staged.Machine.Network
	s.machine.Spec.KernelModules = st.Staged.Machine.KernelModules
	fmt.Fprintln(s.log, "liken-init: network and kernel modules from the spec the agent staged")
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
