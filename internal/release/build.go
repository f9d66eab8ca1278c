package release

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/cpio"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/initramfs"
)

// BootModules are loaded by init in the initramfs: disks, filesystems, watchdogs and the
// EFI store that keeps a panic's log for the next boot (why a trial failed). The
// Debian kernel builds none of them in. The disk controllers are all loaded, whatever the
// hardware: the root image is found on one of them before anything else runs (the SAS and
// RAID controllers of most rack servers: megaraid_sas for Broadcom/LSI MegaRAID, mpt3sas
// for their SAS HBAs).
var BootModules = []string{
	"virtio_pci", "virtio_blk", "virtio_scsi", "virtio_rng", "nvme", "ahci", "sd_mod", "megaraid_sas", "mpt3sas",
	"squashfs", "ext4", "crc32c_generic", "vfat", "nls_cp437", "nls_ascii", "loop",
	"efivarfs", "efi_pstore",
	// The installer image's media (internal/installer): before the root image, the
	// initramfs finds the image on a CD (AHCI above; sr_mod, ISO 9660) or a USB stick (USB 3
	// host controllers with their USB 2 companions, USB mass storage, USB attached SCSI).
	"sr_mod", "isofs", "xhci_pci", "ehci_pci", "usb_storage", "uas",
	// Watchdogs, hardware first: /dev/watchdog is the first one registered, so softdog (the
	// kernel's timer, which a hung kernel does not fire) is it only on a machine with none
	// of the others. i6300esb: QEMU's; iTCO_wdt (through lpc_ich, which makes its device):
	// the TCO timer of Intel chipsets; sp5100_tco: AMD's. Each loads without its hardware
	// and binds nothing.
	"i6300esb", "lpc_ich", "iTCO_wdt", "sp5100_tco", "softdog",
}

// SystemModules are in the root image for the booted system and k3s (k3s modprobes some of
// them itself; init preloads them).
var SystemModules = []string{
	"overlay", "br_netfilter", "veth", "vxlan", "nf_conntrack", "nf_nat", "nf_tables", "nft_compat",
	"nft_chain_nat", "ip_tables", "iptable_nat", "iptable_filter", "iptable_mangle", "ip6_tables",
	"ip6table_nat", "ip6table_filter", "ip6table_mangle", "xt_addrtype", "xt_conntrack", "xt_comment",
	"xt_multiport", "xt_statistic", "xt_mark", "xt_MASQUERADE", "xt_nat", "xt_REDIRECT", "ipt_REJECT",
	"ip6t_REJECT", "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "bonding", "8021q", "virtio_net",
	// What k3s's rules, network policy and flannel's backends use beyond the above
	// (checkKernelConfig requires some of them).
	"xt_ipvs", "xt_tcpudp", "nf_conntrack_netlink", "ip_set", "ip_set_hash_ip", "ip_set_hash_net",
	"ip_set_hash_ipport", "ip_set_hash_ipportnet", "ip_set_hash_ipportip", "ip_set_hash_netport", "xt_set",
	"nfnetlink_log", "xt_NFLOG", "xt_limit", "xt_physdev", "wireguard", "sch_htb", "ifb",
}

// HardwareModules are the drivers of hardware a machine may have: in the root image, but
// loaded only for a device present, by init's coldplug (every device's modalias resolved
// through modules.alias, as udev does), never blindly. Each says why it is here; a name
// the kernel does not have fails the build.
var HardwareModules = []struct{ Name, Why string }{
	{"e1000", "Intel PRO/1000 (82540-82547): older servers, and QEMU's default NIC"},
	{"e1000e", "Intel 8257x/8258x/I217-I219 gigabit: on-board NICs of most Intel boards, QEMU's e1000e"},
	{"igb", "Intel 82575/82576/82580/I210/I350 gigabit: server boards and add-in cards"},
	{"igc", "Intel I225/I226 2.5 gigabit: recent boards"},
	{"ixgbe", "Intel 82598/82599/X520/X540/X550 10 gigabit"},
	{"i40e", "Intel X710/XL710/XXV710 10-40 gigabit"},
	{"ice", "Intel E810 25-100 gigabit"},
	{"mlx5_core", "NVIDIA/Mellanox ConnectX-4 and later, the commonest 25-100 gigabit server NICs"},
	{"bnxt_en", "Broadcom NetXtreme-C/E 10-200 gigabit"},
	{"tg3", "Broadcom NetXtreme gigabit: on-board NICs of many Dell and HP servers"},
	{"r8169", "Realtek 8169/8168/8111 gigabit: small machines and desktops"},
	{"ena", "AWS Elastic Network Adapter: EC2 instances"},
	{"gve", "Google Virtual NIC: Compute Engine instances"},
}

// BuildOptions are the inputs of a release; equal inputs give byte-identical outputs.
type BuildOptions struct {
	Version string
	// Source is the liken module's directory; its commands are built from it.
	Source string
	// KernelDeb is the linux-image .deb (empty: the current one, through apt, cached in
	// KernelCache).
	KernelDeb, KernelCache string
	// K3s is the k3s binary and K3sVersion its version; with StandIn, liken's k3s
	// stand-in is built instead and the release says so.
	K3s, K3sVersion string
	StandIn         bool
	// TestSwitches builds liken's programs with the test build tag
	// (initramfs.TestBuildTag), so init honours the liken.test.* switches the VM tests
	// inject faults with; the release document says so (Test).
	TestSwitches bool
	// Epoch is every timestamp in the release (SOURCE_DATE_EPOCH).
	Epoch time.Time
	Out   string
	Log   io.Writer
}

// Build assembles a release into opts.Out: vmlinuz, initramfs.img, rootfs.squashfs and
// release.json. It returns the document's digest.
func Build(opts BuildOptions) (string, *apirelease.Document, error) {
	if !apirelease.ValidVersion(opts.Version) {
		return "", nil, fmt.Errorf("release version %q is not of the form 2026.07.20-001", opts.Version)
	}
	if (opts.K3s == "") == !opts.StandIn {
		return "", nil, errors.New("give exactly one of --k3s PATH (real k3s) or --k3s-stand-in (tests only)")
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	step := func(format string, args ...any) { fmt.Fprintf(log, "release build: "+format+"\n", args...) }
	work, err := os.MkdirTemp("", "liken-release-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(work)
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return "", nil, err
	}

	deb, err := FindKernelDeb(opts.KernelDeb, opts.KernelCache)
	if err != nil {
		return "", nil, err
	}
	step("kernel package %s", filepath.Base(deb))
	var k *Kernel
	if opts.KernelCache != "" {
		k, err = UnpackKernelDebCached(deb, opts.KernelCache)
	} else {
		k, err = UnpackKernelDeb(deb, filepath.Join(work, "kernel"))
	}
	if err != nil {
		return "", nil, err
	}
	step("kernel %s unpacked, modules indexed", k.Version)

	bin := filepath.Join(work, "bin")
	cmds := []string{"liken-initramfs", "liken-init", "liken-agent"}
	if opts.StandIn {
		cmds = append(cmds, "k3s-standin", "liken-pause")
	}
	for _, c := range cmds {
		step("building %s", c)
		if err := goBuild(opts.Source, "./cmd/"+c, filepath.Join(bin, c), opts.TestSwitches); err != nil {
			return "", nil, err
		}
	}
	k3sPath, k3sVersion := opts.K3s, opts.K3sVersion
	if opts.StandIn {
		k3sPath, k3sVersion = filepath.Join(bin, "k3s-standin"), "stand-in"
	}
	k3sSum, err := fileSHA256(k3sPath)
	if err != nil {
		return "", nil, fmt.Errorf("k3s binary: %w", err)
	}
	likenVersion := sourceVersion(opts.Source)

	step("initramfs")
	initrd, err := buildInitramfs(k, filepath.Join(bin, "liken-initramfs"), opts.Version)
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(opts.Out, "initramfs.img"), initrd, 0o644); err != nil {
		return "", nil, err
	}
	step("root image (mksquashfs)")
	images, err := buildRootfs(k, bin, k3sPath, opts, filepath.Join(work, "rootfs"), filepath.Join(opts.Out, "rootfs.squashfs"))
	if err != nil {
		return "", nil, err
	}
	os.Remove(filepath.Join(opts.Out, "vmlinuz"))
	if err := copyFile(k.Vmlinuz(), filepath.Join(opts.Out, "vmlinuz")); err != nil {
		return "", nil, err
	}
	step("slot image")
	if err := buildSlot(opts.Out, opts.Epoch); err != nil {
		return "", nil, err
	}
	doc := &apirelease.Document{
		Schema: apirelease.Schema, Version: opts.Version, Created: opts.Epoch.UTC(), Test: opts.TestSwitches,
		Components: apirelease.Components{
			Kernel: apirelease.Kernel{Version: k.Version, Package: k.Package, PackageSHA256: k.PackageSHA256},
			K3s:    apirelease.K3s{Version: k3sVersion, SHA256: k3sSum, StandIn: opts.StandIn},
			Liken:  apirelease.Liken{Version: likenVersion},
			Images: images,
		},
	}
	for _, name := range SlotFiles {
		st, _ := os.Stat(filepath.Join(opts.Out, name))
		step("%-16s %9d bytes (in the slot image)", name, st.Size())
	}
	// The slot image is the release's one file: a machine writes it whole, verified as it
	// streams, onto its inactive slot partition.
	sum, err := fileSHA256(filepath.Join(opts.Out, SlotImage))
	if err != nil {
		return "", nil, err
	}
	st, _ := os.Stat(filepath.Join(opts.Out, SlotImage))
	doc.Files = []apirelease.File{{Name: SlotImage, Size: st.Size(), SHA256: sum, Role: apirelease.RoleSlot}}
	step("%-16s %9d bytes", SlotImage, st.Size())
	// GRUB goes on the ESP, shared by both slots; install writes it, upgrades leave it.
	efi := filepath.Join(opts.Out, BootloaderImage)
	if err := bootloader.BuildEFI(efi, work); err != nil {
		return "", nil, err
	}
	if sum, err = fileSHA256(efi); err != nil {
		return "", nil, err
	}
	st, _ = os.Stat(efi)
	doc.Files = append([]apirelease.File{{Name: BootloaderImage, Size: st.Size(), SHA256: sum, Role: apirelease.RoleBootloader}}, doc.Files...)
	step("%-16s %9d bytes", BootloaderImage, st.Size())
	raw, err := doc.Marshal()
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(opts.Out, apirelease.DocumentName), raw, 0o644); err != nil {
		return "", nil, err
	}
	return apirelease.Digest(raw), doc, nil
}

// GoBuild builds the Go program pkg of liken's source into out, as a release's programs are
// built (the lab builds its demo workload with it).
func GoBuild(source, pkg, out string) error {
	return goBuild(source, pkg, out, false)
}

// goBuild builds a static, reproducible binary: no cgo (the image has no libc), no paths,
// no build ID, no VCS stamp. test adds the test build tag.
func goBuild(source, pkg, out string, test bool) error {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}
	if test {
		args = append(args, "-tags", initramfs.TestBuildTag)
	}
	cmd := exec.Command("go", append(args, "-o", out, pkg)...)
	cmd.Dir = source
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// sourceVersion is the source's commit, "-dirty" when it has uncommitted changes.
func sourceVersion(dir string) string {
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		v += "-dirty"
	}
	return v
}

// buildInitramfs makes the initramfs: init, the boot modules and their list, /dev/console.
func buildInitramfs(k *Kernel, initBin, version string) ([]byte, error) {
	initData, err := os.ReadFile(initBin)
	if err != nil {
		return nil, err
	}
	return Initramfs(k, initData, BootModules, map[string][]byte{
		"etc/liken/version":        []byte(version + "\n"),
		"etc/liken/kernel-release": []byte(k.Version + "\n"),
	})
}

// Initramfs packs an initramfs (gzip'd newc cpio) for kernel k: init, the modules named and
// those they need, with their list in load order at etc/liken/boot-modules (what
// initramfs.LoadModules reads), /dev/console, and the extra files.
func Initramfs(k *Kernel, initData []byte, modules []string, extra map[string][]byte) ([]byte, error) {
	files, err := k.Resolve(modules...)
	if err != nil {
		return nil, err
	}
	modRoot := "lib/modules/" + k.Version
	type file struct {
		mode uint32
		data []byte
	}
	entries := map[string]file{
		"init":                   {cpio.ModeRegular | 0o755, initData},
		"etc/liken/boot-modules": {cpio.ModeRegular | 0o644, []byte(strings.Join(files, "\n") + "\n")},
	}
	for name, data := range extra {
		entries[name] = file{cpio.ModeRegular | 0o644, data}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir(), f))
		if err != nil {
			return nil, err
		}
		entries[modRoot+"/"+f] = file{cpio.ModeRegular | 0o644, b}
	}
	dirs := map[string]bool{"dev": true, "proc": true, "sys": true, "run": true, "newroot": true}
	for name := range entries {
		for d := filepath.Dir(name); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before children
	var buf bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	w := cpio.NewWriter(gz)
	for _, n := range names {
		if dirs[n] {
			if err := w.Write(cpio.Entry{Name: n, Mode: cpio.ModeDir | 0o755}); err != nil {
				return nil, err
			}
			if n == "dev" {
				// Init's first output needs a console before devtmpfs is mounted.
				if err := w.Write(cpio.Entry{Name: "dev/console", Mode: cpio.ModeChar | 0o600, RdevMajor: 5, RdevMinor: 1}); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := w.Write(cpio.Entry{Name: n, Mode: entries[n].mode, Data: entries[n].data}); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// stageModules puts the image's modules (BootModules, SystemModules, HardwareModules and
// what they need) under stage's lib/modules with the kernel's built-in lists, and depmod's
// index of exactly those: what liken's modprobe and init's coldplug read. It returns the
// module files init loads at every boot (all but the hardware's, which coldplug loads for
// the devices present) and every file staged.
func stageModules(k *Kernel, stage string, put func(rel, src string, mode os.FileMode) error) (preload, all []string, err error) {
	preload, err = k.Resolve(append(append([]string{}, BootModules...), SystemModules...)...)
	if err != nil {
		return nil, nil, err
	}
	names := append(append([]string{}, BootModules...), SystemModules...)
	for _, h := range HardwareModules {
		names = append(names, h.Name)
	}
	files, err := k.Resolve(names...)
	if err != nil {
		return nil, nil, fmt.Errorf("the hardware's drivers: %w", err)
	}
	modRoot := filepath.Join("lib", "modules", k.Version)
	for _, f := range files {
		if err := put(filepath.Join(modRoot, f), filepath.Join(k.ModulesDir(), f), 0o644); err != nil {
			return nil, nil, err
		}
	}
	for _, meta := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		if _, err := os.Stat(filepath.Join(k.ModulesDir(), meta)); err == nil {
			if err := put(filepath.Join(modRoot, meta), filepath.Join(k.ModulesDir(), meta), 0o644); err != nil {
				return nil, nil, err
			}
		}
	}
	return preload, files, depmod(stage, k.Version)
}

// stager copies a file into stage at rel with mode, making its directories.
func stager(stage string) func(rel, src string, mode os.FileMode) error {
	return func(rel, src string, mode os.FileMode) error {
		dst := filepath.Join(stage, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := copyFile(src, dst); err != nil {
			return err
		}
		return os.Chmod(dst, mode)
	}
}

// buildRootfs stages the root image and packs it with mksquashfs, reproducibly; it returns the
// container images the root image carries.
func buildRootfs(k *Kernel, bin, k3sPath string, opts BuildOptions, stage, out string) (images []apirelease.Image, err error) {
	put := stager(stage)
	write := func(rel string, data []byte) error {
		dst := filepath.Join(stage, rel)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		return os.WriteFile(dst, data, 0o644)
	}
	for _, p := range []struct{ rel, src string }{
		{"sbin/init", filepath.Join(bin, "liken-init")},
		{"usr/bin/liken-agent", filepath.Join(bin, "liken-agent")},
		{"usr/bin/k3s", k3sPath},
	} {
		if err := put(p.rel, p.src, 0o755); err != nil {
			return nil, err
		}
	}
	// liken-init is also liken's modprobe, which k3s runs through its PATH and the kernel
	// through kernel.modprobe.
	if err := os.Symlink("init", filepath.Join(stage, "sbin", "modprobe")); err != nil {
		return nil, err
	}
	// No shell: iptables reaches k3s's static xtables-nft-multi through links (host/k3s).
	for name, target := range k3s.IptablesLinks(k3s.DefaultPaths.DataDir) {
		dst := filepath.Join(stage, k3s.IptablesDir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		if err := os.Symlink(target, dst); err != nil {
			return nil, err
		}
	}
	if err := stageMkfsTools(stage, put); err != nil {
		return nil, fmt.Errorf("the data disks' mkfs tools: %w", err)
	}
	files, staged, err := stageModules(k, stage, put)
	if err != nil {
		return nil, err
	}
	if err := checkKernelConfig(k.Config(), staged); err != nil {
		return nil, err
	}
	ca := "/etc/ssl/certs/ca-certificates.crt"
	if err := put("etc/ssl/certs/ca-certificates.crt", ca, 0o644); err != nil {
		return nil, fmt.Errorf("CA certificates (from %s): %w", ca, err)
	}
	if err := write("etc/os-release", []byte(fmt.Sprintf("NAME=liken\nID=liken\nVERSION_ID=%s\nPRETTY_NAME=\"liken %s\"\n", opts.Version, opts.Version))); err != nil {
		return nil, err
	}
	if err := write("etc/liken/version", []byte(opts.Version+"\n")); err != nil {
		return nil, err
	}
	if err := write("etc/liken/kernel-release", []byte(k.Version+"\n")); err != nil {
		return nil, err
	}
	if err := write(apirelease.BuildTimeFile, []byte(opts.Epoch.UTC().Format(time.RFC3339)+"\n")); err != nil {
		return nil, err
	}
	if err := write("etc/liken/system-modules", []byte(strings.Join(files, "\n")+"\n")); err != nil {
		return nil, err
	}
	if opts.StandIn {
		if images, err = putStandIn(opts.Source, filepath.Join(bin, "liken-pause"), opts.Epoch, put, stage, opts.Log); err != nil {
			return nil, err
		}
		// Init reads this to give the stand-in what real k3s would not need.
		if err := write("etc/liken/k3s-stand-in", []byte("this release carries liken's k3s stand-in, not k3s: tests only\n")); err != nil {
			return nil, err
		}
	} else if err := write("etc/liken/k3s-version", []byte(opts.K3sVersion+"\n")); err != nil {
		return nil, err
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "var", "mnt", "etc/rancher", "root"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return nil, err
		}
	}
	// The root image is read-only: what init writes at boot lives under /run, what lasts on
	// the state partition (initd's host.go).
	for _, l := range []struct{ name, target string }{
		{"etc/resolv.conf", "/run/liken/resolv.conf"},
		{"etc/hosts", "/run/liken/hosts"},
		{"etc/machine-id", "/var/lib/liken/machine-id"},
	} {
		if err := os.Symlink(l.target, filepath.Join(stage, l.name)); err != nil {
			return nil, err
		}
	}
	// As k3s's own image has them: name lookup by files then DNS, and a root user.
	for name, data := range map[string]string{
		"etc/nsswitch.conf": "hosts: files dns\n",
		"etc/passwd":        "root:x:0:0:root:/root:/sbin/nologin\n",
		"etc/group":         "root:x:0:\n",
	} {
		if err := write(name, []byte(data)); err != nil {
			return nil, err
		}
	}
	os.Remove(out)
	// zstd at level 6, not mksquashfs's default 15: on a stand-in release's 255 MB tree
	// (2 cores, beside other work) level 15 took 156 s for 71.1 MB, level 6 took 6 s for
	// 77.2 MB, and level 19 took 200 s for 70.6 MB. Every release build paid two and a half
	// minutes for 9% fewer bytes to download; decompression at boot runs at the same speed.
	cmd := exec.Command("mksquashfs", stage, out, "-noappend", "-all-root", "-no-xattrs", "-comp", "zstd", "-Xcompression-level", "6", "-quiet", "-no-progress")
	cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", opts.Epoch.Unix()))
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mksquashfs: %w: %s", err, b)
	}
	return images, nil
}

// SlotImage is the release's slot image; SlotFiles are the files in it, which the boot
// loader and init read from the slot partition.
const SlotImage = "slot.img"

// BootloaderImage is GRUB's EFI image in a release.
const BootloaderImage = "bootx64.efi"

var SlotFiles = []string{"vmlinuz", "initramfs.img", "rootfs.squashfs"}

// buildSlot makes the FAT slot image holding SlotFiles, reproducibly (mkfs.vfat
// --invariant; mtools takes file times from SOURCE_DATE_EPOCH).
func buildSlot(out string, epoch time.Time) error {
	var total int64
	for _, f := range SlotFiles {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			return err
		}
		total += st.Size()
	}
	// Room for FAT tables and cluster slack.
	mib := total>>20 + 8
	if mib < 40 {
		mib = 40
	}
	// 4096-byte FAT sectors: Linux mounts a FAT only with sectors at least as large as the
	// disk's, and a slot image is written unchanged to disks of 512- and 4096-byte sectors.
	// FAT16 while the image is small enough for it, by cluster count as every reader counts;
	// FAT32 needs 65525 clusters, 256 MiB at one sector a cluster.
	fat := []string{"-F", "16", "-s", "1"}
	if mib > 240 {
		fat = []string{"-F", "32", "-s", "1"}
		mib = max(mib, 260)
	}
	img := filepath.Join(out, SlotImage)
	os.Remove(img)
	env := append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch.Unix()))
	mkfs := exec.Command("mkfs.vfat", append(append([]string{"-S", "4096"}, fat...), "--invariant", "-n", "LIKEN-SLOT", "-C", img, fmt.Sprint(mib*1024))...)
	mkfs.Env = env
	if b, err := mkfs.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.vfat: %w: %s", err, b)
	}
	args := []string{"-i", img}
	for _, f := range SlotFiles {
		args = append(args, filepath.Join(out, f))
	}
	mcopy := exec.Command("mcopy", append(args, "::/")...)
	mcopy.Env = env
	if b, err := mcopy.CombinedOutput(); err != nil {
		return fmt.Errorf("mcopy: %w: %s", err, b)
	}
	return nil
}
