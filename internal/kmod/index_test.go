package kmod

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// testIndex writes a module index as depmod would for a few modules.
func testIndex(t *testing.T) *Index {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"modules.dep": strings.Join([]string{
			"kernel/fs/overlayfs/overlay.ko.xz:",
			"kernel/net/netfilter/nf_conntrack.ko.xz: kernel/net/ipv6/netfilter/nf_defrag_ipv6.ko.xz kernel/net/ipv4/netfilter/nf_defrag_ipv4.ko.xz",
			"kernel/net/ipv6/netfilter/nf_defrag_ipv6.ko.xz:",
			"kernel/net/ipv4/netfilter/nf_defrag_ipv4.ko.xz:",
			"kernel/net/netfilter/nf_tables.ko.xz: kernel/net/netfilter/nfnetlink.ko.xz",
			"kernel/net/netfilter/nfnetlink.ko.xz:",
			"kernel/net/netfilter/nft_chain_nat.ko.xz: kernel/net/netfilter/nf_nat.ko.xz kernel/net/netfilter/nf_tables.ko.xz kernel/net/netfilter/nfnetlink.ko.xz",
			"kernel/net/netfilter/nf_nat.ko.xz: kernel/net/netfilter/nf_conntrack.ko.xz",
			"kernel/net/bridge/br_netfilter.ko.xz: kernel/net/bridge/bridge.ko.xz",
			"kernel/net/bridge/bridge.ko.xz:",
		}, "\n") + "\n",
		"modules.alias": strings.Join([]string{
			"alias fs-overlay overlay",
			"alias nfnetlink-subsys-10 nf_tables",
			"alias nft-expr-counter nf_tables",
			"alias nft-chain-2-nat nft_chain_nat",
			"alias nft-chain-10-nat nft_chain_nat",
			"alias net-pf-7 bridge",
			"alias pci:v00001AF4d00001000sv*sd*bc*sc*i* virtio_net",
		}, "\n") + "\n",
		"modules.builtin":         "kernel/net/unix/unix.ko\n",
		"modules.builtin.modinfo": "unix.alias=net-pf-1\x00unix.license=GPL\x00",
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ix, err := OpenIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func TestLookup(t *testing.T) {
	ix := testIndex(t)
	for _, tt := range []struct {
		name    string
		want    []string
		builtin bool
		missing bool
	}{
		{"overlay", []string{"overlay"}, false, false},
		{"fs-overlay", []string{"overlay"}, false, false},
		{"nf-conntrack", []string{"nf_conntrack"}, false, false},
		{"nft-expr-counter", []string{"nf_tables"}, false, false},
		{"nft-chain-2-nat", []string{"nft_chain_nat"}, false, false},
		{"pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00", []string{"virtio_net"}, false, false},
		{"unix", nil, true, false},
		{"net-pf-1", nil, true, false},
		{"no_such_module", nil, false, true},
	} {
		got, builtin, err := ix.Lookup(tt.name)
		if (err != nil) != tt.missing || builtin != tt.builtin || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Lookup(%q) = %v, builtin %v, %v", tt.name, got, builtin, err)
		}
	}
	order, err := ix.deps.Resolve("nft_chain_nat")
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, f := range order {
		pos[Name(f)] = i
	}
	for _, before := range [][2]string{{"nfnetlink", "nf_tables"}, {"nf_conntrack", "nf_nat"}, {"nf_nat", "nft_chain_nat"}, {"nf_defrag_ipv4", "nf_conntrack"}} {
		if pos[before[0]] >= pos[before[1]] {
			t.Errorf("%s loads after %s: %v", before[0], before[1], order)
		}
	}
}

func TestOptions(t *testing.T) {
	run, etc := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(run, "liken.conf"), OptionsFile(map[string]string{"dummy": "numdummies=2", "bonding": "", "br-netfilter": "x=1"}), 0o644)
	os.WriteFile(filepath.Join(etc, "liken.conf"), []byte("options dummy numdummies=9\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "other.conf"), []byte("# a comment\noptions loop max_loop=8\nblacklist pcspkr\n"), 0o644)
	got := ReadOptions([]string{run, etc})
	want := map[string]string{"dummy": "numdummies=2", "br_netfilter": "x=1", "loop": "max_loop=8"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ReadOptions = %v, want %v", got, want)
	}
}

func TestModprobeRefuses(t *testing.T) {
	var b strings.Builder
	for _, args := range [][]string{{"-r", "overlay"}, {"--show-depends", "overlay"}, {}} {
		b.Reset()
		if code := ModprobeMain(args, &b); code != 1 || b.Len() == 0 {
			t.Errorf("modprobe %v: exit %d, %q", args, code, b.String())
		}
	}
}
