package release

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/kmod"
)

// TestK3sModprobeCalls: every module k3s asks modprobe for at start (pkg/agent/syssetup:
// "modprobe -- NAME" for these exact names, the three nft aliases included; the ip6table
// ones with IPv6) is found in the root image's own module index, as liken's modprobe finds
// it: in Debian's real kernel, with the image's module set and depmod's index of it. A name
// this kernel has no module or alias for at all (nft-expr-counter: the counter expression
// is part of nf_tables here) fails with any modprobe, and k3s only warns; the test says so.
func TestK3sModprobeCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("unpacks Debian's kernel package")
	}
	cache := filepath.Join(userCache(), "liken", "kernel")
	if m, _ := filepath.Glob(filepath.Join(cache, "linux-image-*.deb")); len(m) == 0 {
		cache = t.TempDir() // not the shared cache: a release build may be downloading into it
	}
	deb, err := FindKernelDeb("", cache)
	if err != nil {
		t.Fatal(err)
	}
	k, err := UnpackKernelDeb(deb, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stage := t.TempDir()
	put := func(rel, src string, mode os.FileMode) error {
		dst := filepath.Join(stage, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return copyFile(src, dst)
	}
	preload, files, err := stageModules(k, stage, put)
	if err != nil {
		t.Fatal(err)
	}
	// The hardware's drivers are in the image but not in what init loads at every boot: its
	// coldplug loads them for the devices present.
	for _, h := range HardwareModules {
		if h.Why == "" {
			t.Errorf("HardwareModules: %s says not why it is there", h.Name)
		}
		in := func(list []string) bool {
			for _, f := range list {
				if kmod.Name(strings.TrimSuffix(strings.TrimSuffix(filepath.Base(f), ".xz"), ".ko")) == kmod.Name(h.Name) {
					return true
				}
			}
			return false
		}
		if !in(files) || in(preload) {
			t.Errorf("%s: staged %v, loaded at every boot %v; want staged only", h.Name, in(files), in(preload))
		}
	}
	// Debian's kernel passes the check with the image's modules, as every release build checks.
	if err := checkKernelConfig(k.Config(), files); err != nil {
		t.Error(err)
	}
	ix, err := kmod.OpenIndex(filepath.Join(stage, "lib", "modules", k.Version))
	if err != nil {
		t.Fatal(err)
	}
	full, err := kmod.OpenIndex(k.ModulesDir())
	if err != nil {
		t.Fatal(err)
	}
	// What coldplug finds for a device: QEMU's e1000e (an Intel 82574L) by its modalias.
	if mods, _, err := ix.Lookup("pci:v00008086d000010D3sv00008086sd00000000bc02sc00i00"); err != nil || len(mods) != 1 || mods[0] != "e1000e" {
		t.Errorf("the image's modules.alias resolves an 82574L's modalias to %v, %v; want e1000e", mods, err)
	}
	for _, name := range []string{"overlay", "nf_conntrack", "br_netfilter", "iptable_nat", "iptable_filter",
		"nft-expr-counter", "nfnetlink-subsys-11", "nft-chain-2-nat", "ip6table_nat", "ip6table_filter"} {
		mods, builtin, err := ix.Lookup(name)
		if err != nil {
			if _, _, ferr := full.Lookup(name); ferr == nil {
				t.Errorf("modprobe -- %s: %v, but the kernel has it: the image leaves it out", name, err)
			} else {
				t.Logf("modprobe -- %s: this kernel has no such module or alias (any modprobe fails; k3s warns)", name)
			}
			continue
		}
		t.Logf("modprobe -- %s: modules %v, built in %v", name, mods, builtin)
	}
}

func userCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return d
	}
	return os.TempDir()
}

// TestKernelConfigCheck: a configuration missing one option k3s needs, or building one as a
// module the image leaves out, fails the check, naming it.
func TestKernelConfigCheck(t *testing.T) {
	var lines []string
	var modules []string
	for _, o := range kernelNeeds {
		if o.module != "" {
			lines = append(lines, "CONFIG_"+o.name+"=m")
			modules = append(modules, "kernel/x/"+o.module+".ko.xz")
		} else {
			lines = append(lines, "CONFIG_"+o.name+"=y")
		}
	}
	write := func(drop string, extra ...string) string {
		var b strings.Builder
		b.WriteString("# a comment\n# CONFIG_FOO is not set\n")
		for _, l := range append(lines, extra...) {
			if !strings.HasPrefix(l, "CONFIG_"+drop+"=") || drop == "" {
				b.WriteString(l + "\n")
			}
		}
		p := filepath.Join(t.TempDir(), "config")
		os.WriteFile(p, []byte(b.String()), 0o644)
		return p
	}
	if err := checkKernelConfig(write(""), modules); err != nil {
		t.Fatalf("a complete configuration: %v", err)
	}
	if err := checkKernelConfig(write("MEMCG"), modules); err == nil || !strings.Contains(err.Error(), "CONFIG_MEMCG is not set") {
		t.Errorf("without MEMCG: %v", err)
	}
	var noVeth []string
	for _, m := range modules {
		if !strings.Contains(m, "/veth.") {
			noVeth = append(noVeth, m)
		}
	}
	if err := checkKernelConfig(write(""), noVeth); err == nil || !strings.Contains(err.Error(), "CONFIG_VETH=m but module veth is not in the image") {
		t.Errorf("without the veth module: %v", err)
	}
}
