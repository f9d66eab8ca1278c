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

func TestGUIDText(t *testing.T) {
	for _, s := range []string{"0FC63DAF-8483-4772-8E79-3D69D8477DE4", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"} {
		g, err := ParseGUID(s)
		if err != nil || g.String() != s {
			t.Errorf("%s: read back as %s (%v)", s, g, err)
		}
	}
	// The first field lies little-endian on disk.
	if g := MustGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4"); g[0] != 0xAF || g[3] != 0x0F {
		t.Errorf("on-disk bytes %x", g[:4])
	}
	for _, bad := range []string{"", "0FC63DAF84834772-8E79-3D69D8477DE4xx", "ZZC63DAF-8483-4772-8E79-3D69D8477DE4"} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("%q read as a GUID", bad)
		}
	}
}

// TestWriteTableOfEachSectorSize writes a GPT with WriteTable on loop devices of 512- and
// 4096-byte sectors, then has sgdisk verify it and the kernel scan it: each partition is
// where the kernel puts it, with its name, and ReadTable reads back what was written.
func TestWriteTableOfEachSectorSize(t *testing.T) {
	looptest.Require(t, "sgdisk")
	for _, sector := range []int64{512, 4096} {
		t.Run(strconv.FormatInt(sector, 10), func(t *testing.T) {
			const size = 64 << 20
			loop, _ := loopImage(t, size, sector)
			mib := (1 << 20) / sector
			linux := MustGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
			parts := []Entry{
				{Type: linux, GUID: RandomGUID(), First: mib, Last: 17*mib - 1, Name: "data-one"},
				{Type: linux, GUID: RandomGUID(), First: 17 * mib, Last: 63*mib - 1, Name: "data-two"},
			}
			f, err := os.OpenFile(loop, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			diskGUID := RandomGUID()
			if err := WriteTable(f, size, sector, diskGUID, parts); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("sgdisk", "-v", loop).CombinedOutput(); err != nil || !strings.Contains(string(out), "No problems found") {
				t.Errorf("sgdisk -v: %v: %s", err, out)
			}
			if out, _ := exec.Command("sgdisk", "-p", loop).CombinedOutput(); !strings.Contains(string(out), "data-one") || !strings.Contains(string(out), "data-two") {
				t.Errorf("sgdisk -p shows no names: %s", out)
			}
			exec.Command("partx", "-u", loop).Run()
			back, err := ReadTable(f)
			if err != nil {
				t.Fatal(err)
			}
			if back.DiskGUID != diskGUID || len(back.Entries) != 2 {
				t.Fatalf("read back %+v", back)
			}
			for i, e := range back.Entries {
				if e.Name != parts[i].Name || e.First != parts[i].First || e.Last != parts[i].Last || e.GUID != parts[i].GUID || e.Index != i+1 {
					t.Errorf("entry %d: wrote %+v, read %+v", i, parts[i], e)
				}
				part := filepath.Base(loop) + "p" + strconv.Itoa(i+1)
				start := sysfsInt(t, "/sys/class/block/"+part+"/start")
				n := sysfsInt(t, "/sys/class/block/"+part+"/size")
				if start*512 != e.Offset(sector) || n*512 != e.Size(sector) {
					t.Errorf("%s: written at %d+%d, the kernel has %d+%d", e.Name, e.Offset(sector), e.Size(sector), start*512, n*512)
				}
			}
			// A damaged primary header: the backup is read, the same table.
			f.WriteAt([]byte{0xFF}, sector+60) // in the disk GUID
			if b, err := ReadTable(f); err != nil || b.DiskGUID != diskGUID {
				t.Errorf("with the primary header damaged: %+v, %v", b, err)
			}
		})
	}
}
