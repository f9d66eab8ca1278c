package install

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/manifest"
)

var small = disk.Layout{ESPMiB: 40, SlotMiB: 64, LayerMiB: 4, MinStateMiB: 64}

func exampleLayer(t *testing.T) string {
	t.Helper()
	docs, err := manifest.Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: filepath.Join(out, "identity"), OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	return res.Layers["agent"]
}

// TestInstallRefuses checks every refusal that happens before the disk is touched. The
// channel is never reached: these fail first.
func TestInstallRefuses(t *testing.T) {
	l := exampleLayer(t)
	pin := "sha256:" + strings.Repeat("0", 64)
	dir := t.TempDir()
	used := filepath.Join(dir, "used.img")
	os.WriteFile(used, append([]byte("EFI PART"), make([]byte, 400<<20)...), 0o644)
	sparse := filepath.Join(dir, "sparse.layer")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil || os.Truncate(sparse, 10<<30) != nil {
		t.Fatal("making a sparse file")
	}
	fifo := filepath.Join(dir, "fifo.layer")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	tooSmall := filepath.Join(dir, "small.img")
	os.WriteFile(tooSmall, make([]byte, 10<<20), 0o644)
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"not empty", Options{Disk: used}, "is not empty"},
		{"too small", Options{Disk: tooSmall}, "is too small: 10 MiB"},
		{"size too small", Options{Disk: filepath.Join(dir, "new.img"), SizeMiB: 100}, "--size 100 MiB is too small"},
		{"no disk", Options{Disk: filepath.Join(dir, "missing.img")}, "does not exist: give --size"},
		{"bad pin", Options{Disk: used, Pin: "latest"}, "is not a release digest"},
		{"liken's own kernel argument", Options{Disk: used, KernelArgs: "quiet liken.slot=B"}, "liken.slot is liken's own boot argument"},
		{"machine not in layer", Options{Disk: used, Machine: "server-1"}, `has no credential for machine "server-1"`},
		{"not bound to one of the layer's machines", Options{Disk: used, Machine: "-"}, "holds the credentials of 2 machines (agent-1, agent-2): a disk not bound to one of them would carry all their private keys; give --machine NAME"},
		{"bad layer", Options{Disk: used, Layer: tooSmall}, "not a gzip stream"},
		{"not the layer built", Options{Disk: used, LayerDigest: "sha256:" + strings.Repeat("0", 64)}, "not the sha256:000"},
		{"huge sparse layer", Options{Disk: used, Layer: sparse}, "is 10737418240 bytes, more than the 67108864 a layer may have"},
		{"layer is a FIFO", Options{Disk: used, Layer: fifo}, "is not a regular file"},
		{"layer is a directory", Options{Disk: used, Layer: dir}, "is not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			if o.Pin == "" {
				o.Pin = pin
			}
			if o.Layer == "" {
				o.Layer = l
			}
			switch o.Machine {
			case "":
				o.Machine = "agent-1"
			case "-":
				o.Machine = "" // not bound
			}
			o.Channel, o.Layout = "file:///nonexistent", small
			before, _ := os.ReadFile(o.Disk)
			_, err := Install(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			after, _ := os.ReadFile(o.Disk)
			if string(before) != string(after) {
				t.Errorf("a refused install changed the disk")
			}
		})
	}
}

// TestInstallRefusesMountedImage attaches an image to a loop device and mounts it.
func TestInstallRefusesMountedImage(t *testing.T) {
	img := filepath.Join(t.TempDir(), "disk.img")
	os.WriteFile(img, make([]byte, 400<<20), 0o644)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup (the host tier runs as root): %v", err)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", loop).Run()
	mnt := t.TempDir()
	if out, err := exec.Command("mount", loop, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	for _, d := range []string{img, loop} {
		_, err := Install(context.Background(), Options{Disk: d, Wipe: true, Layer: exampleLayer(t), Machine: "agent-1", Pin: "sha256:" + strings.Repeat("0", 64), Channel: "file:///x", Layout: small})
		if err == nil || !strings.Contains(err.Error(), "is in use") {
			t.Errorf("install onto %s (mounted): %v", d, err)
		}
	}
}

// TestWantedVersionFromLayer: install compares the release it writes with the one the
// layer asks for (the Machine's spec.version, else the Cluster's) and warns when they differ.
func TestWantedVersionFromLayer(t *testing.T) {
	b, err := os.ReadFile(exampleLayer(t))
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := manifest.Load(filepath.Join("..", "..", "docs", "examples", "cluster.yaml"))
	want, _, _ := unstructured.NestedString(docs[0].Object.Object, "spec", "version")
	_, got, _, err := bootArgs(b, "agent-1")
	if err != nil || got != want || want == "" {
		t.Errorf("wanted version %q, %v; want the Cluster's %q", got, err, want)
	}
}
