// Package install writes a liken machine's disk (a block device or a disk image file): the
// partition table, slot A from a verified release, GRUB with liken's A/B configuration on
// the ESP, the deployment layer, and an empty state partition.
package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// Options are what install needs.
type Options struct {
	Channel, Pin string
	// Version names the pinned release; empty means look the pin up in the channel's index.
	Version string
	Layer   string
	// LayerDigest, when set, is the digest liken layer printed for Layer ("sha256:..."): a
	// layer with other bytes is refused.
	LayerDigest string
	Disk        string
	// SizeMiB creates Disk as an image file of this size when it does not exist.
	SizeMiB int
	// Machine binds the disk to one machine (and keeps only its credential); empty leaves
	// the choice to hardware matching at boot.
	Machine string
	// Wipe allows writing a disk that is not empty.
	Wipe   bool
	Layout disk.Layout
	// KernelArgs are written into the boot loader's environment for every boot (install_args).
	KernelArgs string
	// TrustedRoot is the digest of the channel's signed root: the pin must be a target its
	// keys signed. Empty: the layer's Cluster's spec.channelRoot. InsecureUnsigned takes
	// the channel unsigned instead (as the layer's Cluster's spec.insecureUnsignedChannel
	// does when neither is given): the release is installed unverified, and said so.
	TrustedRoot      string
	InsecureUnsigned bool
	Fetcher          *release.Fetcher
	// Tools make the file systems (HostTools when nil fields): the host's on an operator's
	// machine, the release image's in the installer (internal/installer).
	Tools Tools
	Log   io.Writer
}

// Tools are the programs an install runs, each as the argv before its arguments, and how
// files go into a FAT image.
type Tools struct {
	Mke2fs, MkfsFat []string
	// PutFiles makes dirs and writes files (a path in the FAT image: a local file) into
	// the FAT image img.
	PutFiles func(img string, dirs []string, files map[string]string) error
}

// HostTools are the build host's: e2fsprogs, dosfstools and mtools (hack/deps.sh).
var HostTools = Tools{Mke2fs: []string{"mke2fs"}, MkfsFat: []string{"mkfs.fat"}, PutFiles: mtoolsPut}

// mtoolsPut writes into a FAT image with mtools, which needs no mount and no root.
func mtoolsPut(img string, dirs []string, files map[string]string) error {
	for _, d := range dirs {
		if out, err := exec.Command("mmd", "-i", img, "::"+d).CombinedOutput(); err != nil {
			return fmt.Errorf("mmd %s: %w: %s", d, err, out)
		}
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if out, err := exec.Command("mcopy", "-o", "-i", img, files[name], "::"+name).CombinedOutput(); err != nil {
			return fmt.Errorf("mcopy %s: %w: %s", name, err, out)
		}
	}
	return nil
}

// run runs a tool with args, saying which failed and what it printed.
func run(tool []string, args ...string) error {
	cmd := exec.Command(tool[0], append(tool[1:], args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(tool[len(tool)-1]), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Result is what an install wrote.
type Result struct {
	Disk    string `json:"disk"`
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Machine is the Machine the disk is bound to; empty when found by hardware at boot.
	Machine string `json:"machine,omitempty"`
	Role    string `json:"role"`
	// LayerDigest is the SHA-256 of the layer file written.
	LayerDigest string `json:"layerDigest"`
}

// Install writes the disk.
func Install(ctx context.Context, o Options) (res Result, err error) {
	// An image file this install creates is removed again when the install fails: half an
	// image is no install, and a rerun would refuse it as not empty. A disk that existed is
	// untouched by every refusal up to its partitioning; a failure after it says so.
	partitioned := false
	if _, serr := os.Stat(o.Disk); errors.Is(serr, os.ErrNotExist) && o.SizeMiB > 0 {
		defer func() {
			if err != nil {
				if rerr := os.Remove(o.Disk); rerr == nil {
					err = fmt.Errorf("%w (removed the unfinished image %s)", err, o.Disk)
				}
			}
		}()
	} else {
		defer func() {
			if err != nil && partitioned {
				err = fmt.Errorf("%w (%s now holds an unfinished install: its partition table is written; run the install again with --wipe)", err, o.Disk)
			}
		}()
	}
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	step := func(format string, args ...any) { fmt.Fprintf(log, "install: "+format+"\n", args...) }
	if o.Layout == (disk.Layout{}) {
		o.Layout = disk.DefaultLayout
	}
	if o.Fetcher == nil {
		o.Fetcher = &release.Fetcher{}
	}
	if o.Tools.Mke2fs == nil {
		o.Tools.Mke2fs = HostTools.Mke2fs
	}
	if o.Tools.MkfsFat == nil {
		o.Tools.MkfsFat = HostTools.MkfsFat
	}
	if o.Tools.PutFiles == nil {
		o.Tools.PutFiles = HostTools.PutFiles
	}
	if !apirelease.ValidDigest(o.Pin) {
		return res, fmt.Errorf("--pin %q is not a release digest ('sha256:' and 64 hex digits)", o.Pin)
	}
	if err := bootloader.CheckInstallArgs(o.KernelArgs); err != nil {
		return res, err
	}

	// Everything that can be refused is checked before the disk is touched.
	// Bounded before it is read: a huge (or sparse, or endless) file is refused, not loaded.
	lf, size, err := layer.Open(o.Layer, layer.DefaultLimits)
	if err != nil {
		return res, err
	}
	layerData := make([]byte, size)
	_, err = io.ReadFull(lf, layerData)
	lf.Close()
	if err != nil {
		return res, fmt.Errorf("reading the layer: %w", err)
	}
	sum := sha256.Sum256(layerData)
	res.LayerDigest = "sha256:" + hex.EncodeToString(sum[:])
	if o.LayerDigest != "" && o.LayerDigest != res.LayerDigest {
		return res, fmt.Errorf("the layer %s is %s, not the %s given: it is not the layer that was built", o.Layer, res.LayerDigest, o.LayerDigest)
	}
	idx, _, err := layer.Read(bytes.NewReader(layerData), layer.DefaultLimits)
	if err != nil {
		return res, fmt.Errorf("%s: %w", o.Layer, err)
	}
	if layerData, idx, err = bind(layerData, idx, o.Machine, ""); err != nil {
		return res, err
	}
	specArgs, wantedVersion, cluster, err := bootArgs(layerData, o.Machine)
	if err != nil {
		return res, err
	}
	root, unsigned, err := trust(o, cluster)
	if err != nil {
		return res, err
	}
	// The channel's server is proven as the machines will prove it.
	if o.Fetcher, err = o.Fetcher.Trusting(cluster.Spec.ChannelCA); err != nil {
		return res, fmt.Errorf("the layer's Cluster: spec.channelCA: %w", err)
	}
	if int64(disk.LayerHeaderSize+len(layerData)+disk.LayerTrailerSize) > int64(o.Layout.LayerMiB)<<20 {
		return res, fmt.Errorf("the layer (%d bytes) does not fit the %d MiB layer partition", len(layerData), o.Layout.LayerMiB)
	}
	if err := checkDisk(o); err != nil {
		return res, err
	}
	version := o.Version
	if version == "" {
		if version, err = LookUp(ctx, o.Fetcher, o.Channel, o.Pin); err != nil {
			return res, err
		}
	}
	if root != "" {
		// What the channel's publisher signed, before anything of the release is fetched.
		cache, err := os.MkdirTemp("", "liken-install-tuf-")
		if err != nil {
			return res, err
		}
		verr := tuf.VerifyRelease(ctx, o.Fetcher, o.Channel, root, version, o.Pin, cache)
		os.RemoveAll(cache)
		if verr != nil {
			return res, fmt.Errorf("release %s is not installed: %w", version, verr)
		}
		step("release %s (%s) is what the channel's keys signed (root %s)", version, o.Pin, root)
	} else if unsigned != "" {
		step("WARNING: release %s is installed unverified: the channel is taken unsigned (%s), so nothing proves who published it (docs/upgrade.md, \"Signed channels\")", version, unsigned)
	}
	doc, _, err := o.Fetcher.Document(ctx, o.Channel, version, o.Pin)
	if err != nil {
		return res, err
	}
	slot, efi := doc.File(apirelease.RoleSlot), doc.File(apirelease.RoleBootloader)
	if slot == nil || efi == nil {
		return res, fmt.Errorf("release %s has no slot image or no boot loader: it cannot be installed", version)
	}
	if slot.Size > int64(o.Layout.SlotMiB)<<20 {
		return res, fmt.Errorf("release %s's slot image (%d bytes) does not fit a %d MiB slot", version, slot.Size, o.Layout.SlotMiB)
	}
	if doc.Components.K3s.StandIn {
		step("warning: release %s carries liken's k3s stand-in, not k3s: for tests only", version)
	}
	if wantedVersion != "" && wantedVersion != version {
		// Allowed (a machine may be installed with an older release and upgraded), but the
		// agent will move the machine to the layer's release at its first reboot turn.
		step("warning: the layer's Cluster wants release %s, and this installs %s: the machine will upgrade to %s once it joins", wantedVersion, version, wantedVersion)
	}

	step("partitioning %s", o.Disk)
	partitioned = true
	if err := disk.Partition(o.Disk, o.Layout); err != nil {
		return res, err
	}
	parts, err := disk.Read(o.Disk)
	if err != nil {
		return res, err
	}
	a := parts[disk.SlotA]
	step("writing release %s into slot A (%d bytes, verified as it streams)", version, slot.Size)
	if err := o.Fetcher.File(ctx, o.Channel, version, *slot, release.PartitionTarget{Path: o.Disk, Offset: a.Offset, Size: a.Size}); err != nil {
		return res, err
	}
	work, err := os.MkdirTemp("", "liken-install-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	efiPath := filepath.Join(work, "bootx64.efi")
	if err := o.Fetcher.File(ctx, o.Channel, version, *efi, release.FileTarget{Path: efiPath}); err != nil {
		return res, err
	}
	step("writing the ESP (GRUB, A/B configuration, environment block)")
	slots := bootloader.Slots{bootloader.SlotA: {State: bootloader.SlotReady, Version: version, Digest: o.Pin, SHA256: slot.SHA256, Size: slot.Size, At: time.Now().UTC().Truncate(time.Second)}}
	if err := writeESP(work, efiPath, o, specArgs, parts[disk.ESP], slots); err != nil {
		return res, err
	}
	step("writing the %s layer%s (%d bytes; as built %s, recorded on the disk)", idx.Role, forMachine(o.Machine), len(layerData), res.LayerDigest)
	if err := writeLayer(o.Disk, parts[disk.Layer], layerData, res.LayerDigest); err != nil {
		return res, err
	}
	st := parts[disk.State]
	step("formatting the state partition (%d MiB)", st.Size>>20)
	// 4096-byte blocks: never smaller than a disk's sectors, which a small file system's
	// default (1024) can be.
	if err := run(o.Tools.Mke2fs, "-q", "-F", "-t", "ext4", "-b", "4096", "-L", disk.State, "-E", fmt.Sprintf("offset=%d", st.Offset), o.Disk, fmt.Sprintf("%dk", st.Size>>10)); err != nil {
		return res, err
	}
	f, err := os.OpenFile(o.Disk, os.O_WRONLY, 0)
	if err != nil {
		return res, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("syncing %s: %w", o.Disk, err)
	}
	step("done: %s boots release %s from slot A", o.Disk, version)
	return Result{Disk: o.Disk, Version: version, Digest: o.Pin, Machine: o.Machine, Role: string(idx.Role), LayerDigest: res.LayerDigest}, nil
}

// bind is the layer written to one disk: narrowed to machine's credential when machine is
// set, else the layer as it is if it holds at most one machine's. A disk left to find its
// Machine by hardware would otherwise carry every one's private key: one stolen disk would
// let its holder act as any of them. hint, when set, is the machine the disk is known to
// belong to, named in the refusal.
func bind(data []byte, idx *layer.Index, machine, hint string) ([]byte, *layer.Index, error) {
	if machine != "" {
		return layer.Narrow(data, machine)
	}
	if len(idx.Machines) > 1 {
		give := "give --machine NAME"
		if hint != "" {
			give = "give --machine " + hint
		}
		return nil, nil, fmt.Errorf("the %s layer holds the credentials of %d machines (%s): a disk not bound to one of them would carry all their private keys; %s",
			idx.Role, len(idx.Machines), strings.Join(idx.Machines, ", "), give)
	}
	return data, idx, nil
}

// bootArgs are the kernel arguments of the first boot: the layer's Cluster's, and its
// Machine's when the disk is bound to one (or the layer holds only one). A machine found by
// its hardware at boot gets its own arguments staged by the agent and tried at the next reboot.
//
// It also returns the release the layer says the machine should run: its Machine's
// spec.version, else the Cluster's.
func bootArgs(layerData []byte, machine string) (string, string, *v1alpha1.Cluster, error) {
	_, files, err := layer.Read(bytes.NewReader(layerData), layer.DefaultLimits)
	if err != nil {
		return "", "", nil, err
	}
	c, err := layer.DecodeCluster(files[layer.ClusterManifest])
	if err != nil {
		return "", "", nil, err
	}
	var machines []v1alpha1.Machine
	for name, b := range files {
		if strings.HasPrefix(name, layer.MachinesDir+"/") {
			m, err := layer.DecodeMachine(name, b)
			if err != nil {
				return "", "", nil, err
			}
			if machine == "" || m.Name == machine {
				machines = append(machines, *m)
			}
		}
	}
	var margs []v1alpha1.KernelArg
	wanted := string(c.Spec.Version)
	if len(machines) == 1 {
		margs = machines[0].Spec.KernelArgs
		if machines[0].Spec.Version != "" {
			wanted = string(machines[0].Spec.Version)
		}
	}
	return bootloader.JoinArgs(c.Spec.KernelArgs, margs), wanted, c, nil
}

// Trust is what an install checks its pin against (see trust), for the installer image's
// build, which checks the release as an install would before it carries it.
func Trust(trustedRoot string, insecureUnsigned bool, c *v1alpha1.Cluster) (root string, unsigned string, err error) {
	return trust(Options{TrustedRoot: trustedRoot, InsecureUnsigned: insecureUnsigned}, c)
}

// trust is what an install checks its pin against: the channel root given, else the layer's
// Cluster's; or the channel taken unsigned, by the operator's word (given, or the Cluster's).
// Neither is refused: the machine would trust its first release on no one's word, and write
// none after it (its agent refuses a release from a Cluster naming neither).
func trust(o Options, c *v1alpha1.Cluster) (root string, unsigned string, err error) {
	switch {
	case o.TrustedRoot != "" && o.InsecureUnsigned:
		return "", "", errors.New("give a trusted root or take the channel unsigned, not both")
	case o.TrustedRoot != "":
		if !apirelease.ValidDigest(o.TrustedRoot) {
			return "", "", fmt.Errorf("--trusted-root %q is not a digest: give sha256: followed by 64 lowercase hexadecimal digits", o.TrustedRoot)
		}
		return o.TrustedRoot, "", nil
	case o.InsecureUnsigned:
		return "", "--insecure-unsigned", nil
	case c.Spec.ChannelRoot != "":
		return string(c.Spec.ChannelRoot), "", nil
	case c.Spec.InsecureUnsignedChannel:
		return "", "the layer's Cluster sets spec.insecureUnsignedChannel", nil
	}
	return "", "", errors.New("the layer's Cluster names no spec.channelRoot and does not set spec.insecureUnsignedChannel: nothing says whose releases this machine may run, and it would write none after this one. " +
		"Build the layers from a Cluster naming the channel's signed root (liken release keys init printed its digest), or give --trusted-root DIGEST, or --insecure-unsigned to install unverified")
}

func forMachine(m string) string {
	if m == "" {
		return ""
	}
	return " for machine " + m
}

// checkDisk refuses a disk that is in use, too small, or not empty without Wipe, and
// creates an image file when asked.
func checkDisk(o Options) error {
	st, err := os.Stat(o.Disk)
	switch {
	case errors.Is(err, os.ErrNotExist) && o.SizeMiB > 0:
		if o.SizeMiB < o.Layout.MinSizeMiB() {
			return fmt.Errorf("--size %d MiB is too small: the layout needs at least %d MiB", o.SizeMiB, o.Layout.MinSizeMiB())
		}
		f, err := os.OpenFile(o.Disk, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Truncate(int64(o.SizeMiB) << 20)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s does not exist: give --size to create a disk image", o.Disk)
	case err != nil:
		return err
	}
	if o.SizeMiB > 0 {
		return fmt.Errorf("%s exists: --size only creates a new image", o.Disk)
	}
	if user := inUse(o.Disk, st); user != "" {
		return fmt.Errorf("%s is in use (%s): refusing to write it", o.Disk, user)
	}
	size := st.Size()
	f, err := os.Open(o.Disk)
	if err != nil {
		return err
	}
	defer f.Close()
	if st.Mode()&os.ModeDevice != 0 {
		if size, err = f.Seek(0, io.SeekEnd); err != nil {
			return err
		}
	}
	if size < int64(o.Layout.MinSizeMiB())<<20 {
		return fmt.Errorf("%s is too small: %d MiB, the layout needs at least %d MiB", o.Disk, size>>20, o.Layout.MinSizeMiB())
	}
	head := make([]byte, 1<<20)
	n, _ := f.ReadAt(head, 0)
	if !o.Wipe && !bytes.Equal(head[:n], make([]byte, n)) {
		return fmt.Errorf("%s is not empty (its first MiB holds data, such as a partition table): give --wipe to erase it", o.Disk)
	}
	return nil
}

// inUse names what holds the disk: a mount of it or of one of its partitions, or a loop
// device backed by the image file.
func inUse(path string, st os.FileInfo) string {
	if st.Mode()&os.ModeDevice != 0 {
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_EXCL, 0)
		if err != nil {
			return "held by the kernel: mounted, or part of another device"
		}
		f.Close()
		return ""
	}
	abs, _ := filepath.Abs(path)
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		b, _ := os.ReadFile(l)
		if strings.TrimSpace(string(b)) == abs {
			return "attached to /dev/" + strings.Split(l, "/")[3]
		}
	}
	return ""
}

// LookUp finds the version the channel's index gives for a pin.
func LookUp(ctx context.Context, f *release.Fetcher, channel, pin string) (string, error) {
	b, err := f.Raw(ctx, channel, apirelease.IndexName, 16<<20)
	if err != nil {
		return "", fmt.Errorf("finding the release pinned as %s: %w (or give --version)", pin, err)
	}
	var idx apirelease.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return "", fmt.Errorf("channel index: %w", err)
	}
	for _, e := range idx.Releases {
		if e.Digest == pin {
			return e.Version, nil
		}
	}
	return "", fmt.Errorf("the channel has no release with digest %s", pin)
}

// espFormat is mkfs.vfat's arguments for the ESP: sectors the disk's size (the firmware
// reads the ESP through the disk's own sectors), FAT32 where the cluster count allows it,
// else FAT16 (a 4096-byte-sector ESP under 256 MiB), as firmware types a FAT by its cluster
// count.
func espFormat(ext disk.Extent, img string) []string {
	sector := max(ext.SectorSize, 512)
	fat := "32"
	if ext.Size/sector < 65525+1024 {
		fat = "16"
	}
	return []string{"-F", fat, "-S", fmt.Sprint(sector), "-s", "1", "-n", bootloader.ESPLabel, "-C", img, fmt.Sprint(ext.Size >> 10)}
}

// writeESP makes the FAT ESP image (o.Tools) and copies it into its partition.
func writeESP(work, efi string, o Options, specArgs string, ext disk.Extent, slots bootloader.Slots) error {
	img := filepath.Join(work, "esp.img")
	if err := run(o.Tools.MkfsFat, espFormat(ext, img)...); err != nil {
		return err
	}
	env1, env2, err := bootloader.EnvCopies(bootloader.Env{bootloader.EnvDefaultSlot: bootloader.SlotA, bootloader.EnvTrialSlot: "",
		bootloader.EnvInstallArgs: o.KernelArgs, bootloader.EnvKernelArgs: specArgs, bootloader.EnvTrialArgs: ""})
	if err != nil {
		return err
	}
	slots1, slots2, err := bootloader.SlotsCopies(slots)
	if err != nil {
		return err
	}
	files := map[string]string{bootloader.EFIBinary: efi}
	for name, data := range map[string][]byte{bootloader.Config: []byte(bootloader.ConfigText), bootloader.EnvFile: env1, bootloader.EnvFile2: env2,
		bootloader.SlotsFile: slots1, bootloader.SlotsFile2: slots2} {
		p := filepath.Join(work, filepath.Base(name))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
		files[name] = p
	}
	if err := o.Tools.PutFiles(img, []string{"EFI", "EFI/BOOT", bootloader.ConfigDir}, files); err != nil {
		return err
	}
	return copyInto(o.Disk, ext, img)
}

func copyInto(diskPath string, ext disk.Extent, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	sink, err := release.PartitionTarget{Path: diskPath, Offset: ext.Offset, Size: ext.Size}.Begin()
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(sink, in, make([]byte, 1<<20)); err != nil {
		sink.Discard()
		return err
	}
	return sink.Commit()
}

// writeLayer writes the layer between its header and its trailer (disk.LayerRecord), which
// records its digest as built and the digest of the bytes written.
func writeLayer(diskPath string, ext disk.Extent, data []byte, built string) error {
	rec, err := disk.NewLayerRecord(data, built)
	if err != nil {
		return err
	}
	sink, err := release.PartitionTarget{Path: diskPath, Offset: ext.Offset, Size: ext.Size}.Begin()
	if err != nil {
		return err
	}
	framed := append(append(rec.Header(), data...), rec.Trailer()...)
	if _, err := sink.Write(framed); err != nil {
		sink.Discard()
		return err
	}
	return sink.Commit()
}

// ReplaceLayer writes a newer layer (built by liken layer from the same cluster identity, for
// the role the disk already has) into an installed disk's layer partition, leaving its slots,
// boot loader and state alone: the machine reads it at its next boot. A server that boots with
// a layer holding more Machines makes the missing ones (internal/bootstrap). The layer is
// checked as Install checks it, and against the layer the disk holds now: same role and same
// cluster CA. It is bound as Install binds it: to o.Machine, else to the machine the disk was
// installed for, else it must hold one machine's credentials only. The result has no
// release: the disk's slots are not looked at.
func ReplaceLayer(o Options) (Result, error) {
	lf, size, err := layer.Open(o.Layer, layer.DefaultLimits)
	if err != nil {
		return Result{}, err
	}
	data := make([]byte, size)
	_, err = io.ReadFull(lf, data)
	lf.Close()
	if err != nil {
		return Result{}, fmt.Errorf("reading the layer: %w", err)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if o.LayerDigest != "" && o.LayerDigest != digest {
		return Result{}, fmt.Errorf("the layer %s is %s, not the %s given: it is not the layer that was built", o.Layer, digest, o.LayerDigest)
	}
	idx, _, err := layer.Read(bytes.NewReader(data), layer.DefaultLimits)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", o.Layer, err)
	}
	parts, err := disk.Read(o.Disk)
	if err != nil {
		return Result{}, fmt.Errorf("%s is not an installed liken disk: %w", o.Disk, err)
	}
	ext, ok := parts[disk.Layer]
	if !ok {
		return Result{}, fmt.Errorf("%s has no layer partition: it is not an installed liken disk", o.Disk)
	}
	old, err := readInstalledLayer(o.Disk, ext)
	if err != nil {
		return Result{}, fmt.Errorf("reading the layer %s holds now: %w", o.Disk, err)
	}
	if old.Role != idx.Role || old.CAHash != idx.CAHash {
		return Result{}, fmt.Errorf("%s holds a %s layer of cluster CA %.12s; this is a %s layer of cluster CA %.12s: not a newer layer for this machine", o.Disk, old.Role, old.CAHash, idx.Role, idx.CAHash)
	}
	// A disk installed for one machine stays that machine's: its state partition holds that
	// machine's agent state and k3s data, so the newer layer is narrowed to the same machine,
	// and another machine's credential is refused.
	machine := o.Machine
	switch {
	case old.Machine != "" && machine == "":
		machine = old.Machine
	case old.Machine != "" && machine != old.Machine:
		return Result{}, fmt.Errorf("%s was installed for machine %s and holds its state: --machine %s would give it another machine's credential; install it afresh (--wipe) for %s",
			o.Disk, old.Machine, machine, machine)
	}
	hint := ""
	if len(old.Machines) == 1 {
		hint = old.Machines[0]
	}
	if data, idx, err = bind(data, idx, machine, hint); err != nil {
		if machine != "" && machine != o.Machine {
			return Result{}, fmt.Errorf("%s was installed for machine %s: %w", o.Disk, machine, err)
		}
		return Result{}, err
	}
	if int64(disk.LayerHeaderSize+len(data)+disk.LayerTrailerSize) > ext.Size {
		return Result{}, fmt.Errorf("the layer (%d bytes) does not fit the disk's %d MiB layer partition", len(data), ext.Size>>20)
	}
	if err := writeLayer(o.Disk, ext, data, digest); err != nil {
		return Result{}, fmt.Errorf("writing the layer into %s: %w", o.Disk, err)
	}
	return Result{Disk: o.Disk, Machine: idx.Machine, Role: string(idx.Role), LayerDigest: digest}, nil
}

// InstalledLayer reads the index of the layer an installed disk holds: its role, its
// cluster, the machines whose credentials it carries and the one it is bound to.
func InstalledLayer(diskPath string) (*layer.Index, error) {
	parts, err := disk.Read(diskPath)
	if err != nil {
		return nil, fmt.Errorf("%s is not an installed liken disk: %w", diskPath, err)
	}
	ext, ok := parts[disk.Layer]
	if !ok {
		return nil, fmt.Errorf("%s has no layer partition: it is not an installed liken disk", diskPath)
	}
	idx, err := readInstalledLayer(diskPath, ext)
	if err != nil {
		return nil, fmt.Errorf("reading the layer %s holds: %w", diskPath, err)
	}
	return idx, nil
}

// readInstalledLayer reads the index of the layer a disk's layer partition holds.
func readInstalledLayer(diskPath string, ext disk.Extent) (*layer.Index, error) {
	f, err := os.Open(diskPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, disk.LayerHeaderSize)
	if _, err := f.ReadAt(head, ext.Offset); err != nil {
		return nil, err
	}
	rec, err := disk.ParseLayerHeader(head, ext.Size)
	if err != nil {
		return nil, err
	}
	data := make([]byte, rec.Length)
	if _, err := f.ReadAt(data, ext.Offset+disk.LayerHeaderSize); err != nil {
		return nil, err
	}
	idx, _, err := layer.Read(bytes.NewReader(data), layer.DefaultLimits)
	return idx, err
}
