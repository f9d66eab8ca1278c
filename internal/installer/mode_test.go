package installer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/disk/looptest"
	"liken.dev/liken/internal/host/datadisk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/manifest"
)

// medium builds an installer image's tree (what the install mode sees mounted) from the
// examples, each Machine edited by edit, and returns its directory.
func medium(t *testing.T, edit func(name string, m map[string]any)) string {
	t.Helper()
	channel, pin, root := testChannel(t)
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		switch d.Object.GetKind() {
		case "Cluster":
			unstructured.SetNestedField(d.Object.Object, root, "spec", "channelRoot")
		case "Machine":
			spec, _, _ := unstructured.NestedMap(d.Object.Object, "spec")
			edit(d.Object.GetName(), spec)
			unstructured.SetNestedMap(d.Object.Object, spec, "spec")
		}
	}
	out := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(out, "identity"), OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if _, err := Build(t.Context(), Options{Channel: "file://" + channel, Pin: pin, Layers: []string{res.Layers["server"], res.Layers["agent"]},
		Out: filepath.Join(t.TempDir(), "i.iso"), Work: work}); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(work, "tree")
}

const gib = int64(1) << 30

// TestInstallModeInstallsTheMatchedMachine: the install mode finds server-2 by its MAC among
// the five Machines of two layers, installs the disk its spec.install names (a loop device)
// from the image's copy of the channel, verified offline against the Cluster's root, and the
// disk holds server-2's layer alone. Run again, the now-installed disk is refused, nothing
// written.
func TestInstallModeInstallsTheMatchedMachine(t *testing.T) {
	looptest.Require(t, "mke2fs", "mkfs.fat", "mtools")
	img := looptest.Image(t, int64(disk.DefaultLayout.MinSizeMiB()+8)<<20)
	loop := looptest.Attach(t, img, 512)
	dir := medium(t, func(name string, spec map[string]any) {
		spec["install"] = map[string]any{"disk": loop}
	})
	var log bytes.Buffer
	// The host's mkfs tools, and the installer's own way into a FAT image (a loop device
	// and the kernel's vfat), as the release image has no mtools, where this kernel has
	// vfat (the VM test's always has).
	tools := install.HostTools
	if fs, _ := os.ReadFile("/proc/filesystems"); bytes.Contains(fs, []byte("\tvfat\n")) {
		tools.PutFiles = loopPut
	} else {
		t.Log("this kernel has no vfat: the ESP's files are put with mtools here; test/vm's TestInstallerInstallsAMachine puts them as the installer does")
	}
	env := Env{Medium: dir, Dev: "/dev", Sys: "/sys", MACs: map[string]bool{"52:54:00:00:00:02": true}, Tools: tools, Log: &log}
	p, err := Decide(env)
	if err != nil {
		t.Fatal(err)
	}
	if p.Machine.Name != "server-2" || p.How != "MAC 52:54:00:00:00:02" || p.Disk != loop || p.Wipe {
		t.Fatalf("plan: machine %s by %s, disk %s (%s), wipe %v", p.Machine.Name, p.How, p.Disk, p.Why, p.Wipe)
	}
	res, err := Install(t.Context(), env, p)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "is what the channel's keys signed") {
		t.Errorf("the install did not check the release's signatures:\n%s", log.String())
	}
	idx, err := install.InstalledLayer(loop)
	if err != nil {
		t.Fatal(err)
	}
	if res.Machine != "server-2" || idx.Machine != "server-2" || len(idx.Machines) != 1 {
		t.Errorf("installed for %s; the disk's layer is bound to %s and holds %v", res.Machine, idx.Machine, idx.Machines)
	}
	// The ESP holds GRUB and liken's configuration, as mtools reads it.
	parts, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	esp := fmt.Sprintf("%s@@%d", img, parts[disk.ESP].Offset)
	for _, f := range []string{bootloader.EFIBinary, bootloader.Config, bootloader.EnvFile} {
		if out, err := exec.Command("mtype", "-i", esp, "::/"+f).Output(); err != nil || len(out) == 0 {
			t.Errorf("the ESP has no %s: %v", f, err)
		}
	}
	before := sum(t, img)
	_, err = Decide(env)
	var r *Refusal
	if !errors.As(err, &r) || !strings.Contains(r.Why, "it holds liken already") || !strings.Contains(r.Why, "contentID") {
		t.Errorf("an installed disk, again: %v", err)
	}
	if sum(t, img) != before {
		t.Error("a refused disk changed")
	}
}

// TestInstallModeRefuses: each refusal says why, and nothing is written.
func TestInstallModeRefuses(t *testing.T) {
	looptest.Require(t, "mke2fs")
	img := looptest.Image(t, int64(disk.DefaultLayout.MinSizeMiB()+8)<<20)
	if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext4", img, "65536").CombinedOutput(); err != nil {
		t.Fatalf("mke2fs: %v %s", err, out)
	}
	loop := looptest.Attach(t, img, 512)
	dir := medium(t, func(name string, spec map[string]any) {
		if name == "server-1" {
			spec["install"] = map[string]any{"disk": loop}
		} else {
			delete(spec, "install")
		}
	})
	big := []v1alpha1.DiskInfo{{Name: "vda", SizeBytes: 8 * gib}, {Name: "vdb", SizeBytes: 8 * gib}, {Name: "vdc", SizeBytes: 1 << 20}}
	before := sum(t, img)
	for _, c := range []struct {
		name  string
		macs  string
		disks []v1alpha1.DiskInfo
		want  string
	}{
		{"no Machine matches", "52:54:00:99:99:99", nil, "no Machine matches this hardware"},
		{"a disk holding a file system", "52:54:00:00:00:01", nil, "is not empty: it holds an ext2/3/4 file system. Nothing was written: to install over it, set Machine server-1's spec.install {disk: ..., wipe: {serial: "},
		{"two disks could be it", "52:54:00:00:00:02", big, "2 disks could be the install disk (vda, vdb): name one in Machine server-2's spec.install.disk"},
		{"no disk large enough", "52:54:00:00:00:02", big[2:], "no disk to install on: vdc (1 MiB: smaller than the 3154 MiB liken needs)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decide(Env{Medium: dir, Dev: "/dev", Sys: "/sys", MACs: map[string]bool{c.macs: true}, Disks: c.disks, Tools: install.HostTools})
			var r *Refusal
			if !errors.As(err, &r) || !strings.Contains(r.Why, c.want) {
				t.Errorf("got %v\nwant %q", err, c.want)
			}
		})
	}
	if sum(t, img) != before {
		t.Error("a refused disk changed")
	}
	// The Machine's wipe naming the disk's serial and what it holds allows it, once.
	f, err := os.Open(loop)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := f.Seek(0, 2)
	found, err := datadisk.Inspect(f, size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	serial := datadisk.Env{Dev: "/dev", Sys: "/sys"}.Serial(loop)
	for _, c := range []struct {
		content string
		wipe    bool
	}{{found.ContentID, true}, {"sha256:" + strings.Repeat("0", 64), false}} {
		dir := medium(t, func(name string, spec map[string]any) {
			spec["install"] = map[string]any{"disk": loop, "wipe": map[string]any{"serial": serial, "contentID": c.content}}
		})
		p, err := Decide(Env{Medium: dir, Dev: "/dev", Sys: "/sys", MACs: map[string]bool{"52:54:00:00:00:01": true}, Tools: install.HostTools})
		if c.wipe && (err != nil || !p.Wipe) {
			t.Errorf("a wipe naming the disk and its content: %v", err)
		}
		if !c.wipe && (err == nil || !strings.Contains(err.Error(), "wipe names another disk or content")) {
			t.Errorf("a wipe naming other content: %v", err)
		}
	}
}

// sum is the SHA-256 of a disk image's first 64 MiB and last MiB: where an install writes
// first (the table, the ESP, slot A's start) and last (the backup table).
func sum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	head, tail := make([]byte, 64<<20), make([]byte, 1<<20)
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(tail, st.Size()-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(append(head, tail...))
	return hex.EncodeToString(h[:])
}
