package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/test/report"
)

// TestBootToSystemStage boots the release's kernel and initramfs in QEMU with a GPT disk
// whose slot partition holds the release's slot image: init loads the boot modules, finds the slot by
// its partition label, mounts the image read-only, switches into it and reaches the system
// stage, which powers off in test mode.
func TestBootToSystemStage(t *testing.T) {
	vmTest(t)
	rel, err := BuildRelease(releaseA)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(rel.Path("slot.img"))
	sizes := map[string]int64{}
	for _, f := range rel.Doc.Files {
		sizes[f.Name] = f.Size
	}
	file := func(n string) int64 { st, _ := os.Stat(rel.Path(n)); return st.Size() }
	how := "built in"
	if rel.Cached {
		how = "from the release cache (checked and copied) in"
	}
	report.Line("release (stand-in k3s) %s %s; slot image %d bytes holding vmlinuz %d, initramfs %d, rootfs %d bytes",
		how, rel.Took.Round(time.Second), sizes["slot.img"], file("vmlinuz"), file("initramfs.img"), file("rootfs.squashfs"))
	disk := filepath.Join(t.TempDir(), "disk.img")
	slotMiB := int(st.Size()>>20) + 8
	if err := GPTDisk(disk, 2*slotMiB+8, []Partition{{Label: "liken-slot-a", SizeMiB: slotMiB, Image: rel.Path("slot.img")}, {Label: "liken-slot-b", SizeMiB: slotMiB}}); err != nil {
		t.Fatal(err)
	}
	var console strings.Builder
	v, err := Boot(Options{
		Kernel: rel.Path("vmlinuz"), Initrd: rel.Path("initramfs.img"),
		Append: "console=ttyS0 quiet panic=-1 liken.root=PARTLABEL=liken-slot-a liken.test=poweroff liken.test.stage=system",
		Disks:  []Disk{{Path: disk}}, Log: &console,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("console:\n%s", v.Console())
		}
	}()
	initrd, err := v.WaitFor(t.Context(), "liken-init: initramfs stage", 90*time.Second)
	if err != nil {
		v.Kill()
		t.Fatal(err)
	}
	mounted, err := v.WaitFor(t.Context(), "mounted root image from slot /dev/vda1 (PARTLABEL=liken-slot-a) read-only", 90*time.Second)
	if err != nil {
		v.Kill()
		t.Fatal(err)
	}
	system, err := v.WaitFor(t.Context(), "liken-init: system stage", 60*time.Second)
	if err != nil {
		v.Kill()
		t.Fatal(err)
	}
	off, err := v.Wait(60 * time.Second)
	if err != nil {
		v.Kill()
		t.Fatal(err)
	}
	if !strings.Contains(v.Console(), "release 2026.11.29-001") {
		t.Errorf("init did not report the release it booted")
	}
	report.Line("VM boot (QEMU TCG, wall clock from QEMU start): init running %s, root image mounted %s, system stage %s, powered off %s",
		initrd.Round(100*time.Millisecond), mounted.Round(100*time.Millisecond), system.Round(100*time.Millisecond), off.Round(100*time.Millisecond))
}
