package release

import (
	"os"
	"path/filepath"
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
	if _, err := stageModules(k, stage, put); err != nil {
		t.Fatal(err)
	}
	ix, err := kmod.OpenIndex(filepath.Join(stage, "lib", "modules", k.Version))
	if err != nil {
		t.Fatal(err)
	}
	full, err := kmod.OpenIndex(k.ModulesDir())
	if err != nil {
		t.Fatal(err)
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
