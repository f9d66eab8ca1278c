package disk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"liken.dev/liken/internal/disk/looptest"
)

// TestReadDisksOfEachSectorSize partitions loop devices of 512- and 4096-byte sectors with
// the layout and reads their GPT back, through the device (its sector size by ioctl) and
// through the image file beneath (the sector size its GPT was written for). Every extent
// is where the kernel's own partition scan puts it.
func TestReadDisksOfEachSectorSize(t *testing.T) {
	looptest.Require(t)
	layout := Layout{ESPMiB: 40, SlotMiB: 48, LayerMiB: 4, MinStateMiB: 32}
	for _, sector := range []int64{512, 4096} {
		t.Run(strconv.FormatInt(sector, 10), func(t *testing.T) {
			loop, img := loopImage(t, int64(layout.MinSizeMiB()+8)<<20, sector)
			if err := Partition(loop, layout); err != nil {
				t.Fatal(err)
			}
			exec.Command("partx", "-u", loop).Run() // the kernel reads the new table
			// liken's own table writer, checked by another: sgdisk finds nothing wrong.
			if out, err := exec.Command("sgdisk", "-v", loop).CombinedOutput(); err != nil || !strings.Contains(string(out), "No problems found") {
				t.Errorf("sgdisk -v: %v: %s", err, out)
			}
			viaDevice, err := Read(loop)
			if err != nil {
				t.Fatal(err)
			}
			viaFile, err := Read(img)
			if err != nil {
				t.Fatal(err)
			}
			if d := viaDevice[State]; d.Offset+d.Size < int64(layout.MinSizeMiB())<<20 {
				t.Errorf("the state partition ends at %d: it does not take the rest of the disk", d.Offset+d.Size)
			}
			f, err := os.Open(loop)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			tab, err := ReadTable(f)
			if err != nil {
				t.Fatal(err)
			}
			if tab.Entries[0].Name != ESP || tab.Entries[0].Type != TypeESP {
				t.Errorf("partition 1 is %s of type %s, not the EFI system partition", tab.Entries[0].Name, tab.Entries[0].Type)
			}
			for _, label := range []string{ESP, SlotA, SlotB, Layer, State} {
				d, f := viaDevice[label], viaFile[label]
				if d != f || d.SectorSize != sector {
					t.Errorf("%s: through the device %+v, through the file %+v", label, d, f)
				}
				// The kernel gives a partition's start and size in 512-byte units.
				part := filepath.Base(loop) + "p" + strconv.Itoa(d.Index)
				start := sysfsInt(t, "/sys/class/block/"+part+"/start")
				size := sysfsInt(t, "/sys/class/block/"+part+"/size")
				if start*512 != d.Offset || size*512 != d.Size {
					t.Errorf("%s: read at %d+%d, the kernel has %d+%d", label, d.Offset, d.Size, start*512, size*512)
				}
				if d.Offset%(1<<20) != 0 {
					t.Errorf("%s starts at %d, not on a MiB", label, d.Offset)
				}
			}
		})
	}
}

// loopImage attaches an image file of size bytes as a loop device of sector-byte sectors,
// detached when the test ends.
func loopImage(t *testing.T, size, sector int64) (loop, img string) {
	t.Helper()
	img = looptest.Image(t, size)
	return looptest.Attach(t, img, int(sector)), img
}

func sysfsInt(t *testing.T, p string) int64 {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("the kernel did not scan the loop device's partitions: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
