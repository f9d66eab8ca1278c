package disk

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"unicode/utf16"
)

// GUID is a GPT GUID as it lies on disk (the first three fields little-endian).
type GUID [16]byte

// ParseGUID reads the text form, such as 0FC63DAF-8483-4772-8E79-3D69D8477DE4.
func ParseGUID(s string) (GUID, error) {
	var g GUID
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 32 || len(s) != 36 {
		return g, fmt.Errorf("%q is not a GUID", s)
	}
	var raw [16]byte
	for i := range raw {
		var b byte
		if _, err := fmt.Sscanf(h[2*i:2*i+2], "%02x", &b); err != nil {
			return g, fmt.Errorf("%q is not a GUID", s)
		}
		raw[i] = b
	}
	// Mixed endianness: the first three fields are stored little-endian.
	g = raw
	g[0], g[1], g[2], g[3] = raw[3], raw[2], raw[1], raw[0]
	g[4], g[5] = raw[5], raw[4]
	g[6], g[7] = raw[7], raw[6]
	return g, nil
}

// MustGUID is ParseGUID for constants.
func MustGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

func (g GUID) String() string {
	return fmt.Sprintf("%02X%02X%02X%02X-%02X%02X-%02X%02X-%X-%X",
		g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8:10], g[10:16])
}

// RandomGUID is a version 4 GUID.
func RandomGUID() GUID {
	var g GUID
	rand.Read(g[:])
	g[7] = g[7]&0x0f | 0x40 // version 4, in the little-endian third field
	g[8] = g[8]&0x3f | 0x80
	return g
}

// Table is a GPT: the disk's GUID and its partitions in table order.
type Table struct {
	DiskGUID   GUID
	SectorSize int64
	// FirstUsable and LastUsable bound the partitions, in sectors.
	FirstUsable, LastUsable int64
	Entries                 []Entry
}

// Entry is one GPT partition.
type Entry struct {
	Index       int // 1-based slot in the table
	Type, GUID  GUID
	First, Last int64 // sectors, inclusive
	Name        string
}

// Offset and Size are in bytes.
func (e Entry) Offset(sector int64) int64 { return e.First * sector }
func (e Entry) Size(sector int64) int64   { return (e.Last - e.First + 1) * sector }

// ErrNoGPT says a disk has no valid GPT header at LBA 1.
var ErrNoGPT = errors.New("no GPT partition table")

const (
	gptEntries   = 128
	gptEntrySize = 128
)

// ReadTable reads a disk's GPT, checking both CRCs: the primary one, or, where the primary
// header is missing or damaged, the backup at the disk's last sector, as UEFI does (2.10,
// 5.3.2). WriteTable writes the backup first, so a write a power cut interrupted still reads
// as the whole table it was writing.
func ReadTable(f *os.File) (*Table, error) {
	sector, err := SectorSize(f)
	if err != nil {
		return nil, err
	}
	t, err := readTableAt(f, sector, 1)
	if err == nil {
		return t, nil
	}
	if size, serr := f.Seek(0, io.SeekEnd); serr == nil && size/sector > 2 {
		if b, berr := readTableAt(f, sector, size/sector-1); berr == nil {
			return b, nil
		}
	}
	return nil, err
}

// readTableAt reads the GPT whose header is at lba.
func readTableAt(f *os.File, sector, lba int64) (*Table, error) {
	hdr := make([]byte, 512)
	if _, err := f.ReadAt(hdr, lba*sector); err != nil {
		return nil, fmt.Errorf("reading the partition table of %s: %w", f.Name(), err)
	}
	if string(hdr[:8]) != "EFI PART" {
		return nil, fmt.Errorf("%s: %w (looked at LBA %d of %d-byte sectors)", f.Name(), ErrNoGPT, lba, sector)
	}
	hsize := binary.LittleEndian.Uint32(hdr[12:])
	if hsize < 92 || hsize > 512 {
		return nil, fmt.Errorf("%s: implausible GPT header size %d", f.Name(), hsize)
	}
	h := append([]byte{}, hdr[:hsize]...)
	want := binary.LittleEndian.Uint32(h[16:])
	binary.LittleEndian.PutUint32(h[16:], 0)
	if crc32.ChecksumIEEE(h) != want {
		return nil, fmt.Errorf("%s: the GPT header's checksum does not match", f.Name())
	}
	t := &Table{SectorSize: sector,
		FirstUsable: int64(binary.LittleEndian.Uint64(hdr[40:])),
		LastUsable:  int64(binary.LittleEndian.Uint64(hdr[48:]))}
	copy(t.DiskGUID[:], hdr[56:72])
	entriesLBA := int64(binary.LittleEndian.Uint64(hdr[72:]))
	n := int(binary.LittleEndian.Uint32(hdr[80:]))
	size := int(binary.LittleEndian.Uint32(hdr[84:]))
	if n > 1024 || size < 128 || size > 4096 {
		return nil, fmt.Errorf("%s: implausible GPT (%d entries of %d bytes)", f.Name(), n, size)
	}
	buf := make([]byte, n*size)
	if _, err := f.ReadAt(buf, entriesLBA*sector); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the partition entries of %s: %w", f.Name(), err)
	}
	if crc32.ChecksumIEEE(buf) != binary.LittleEndian.Uint32(hdr[88:]) {
		return nil, fmt.Errorf("%s: the GPT entries' checksum does not match", f.Name())
	}
	for i := 0; i < n; i++ {
		e := buf[i*size : (i+1)*size]
		if AllZero(e[:16]) {
			continue
		}
		u := make([]uint16, 36)
		for j := range u {
			u[j] = binary.LittleEndian.Uint16(e[56+2*j:])
		}
		en := Entry{Index: i + 1,
			First: int64(binary.LittleEndian.Uint64(e[32:])),
			Last:  int64(binary.LittleEndian.Uint64(e[40:])),
			Name:  strings.TrimRight(string(utf16.Decode(u)), "\x00")}
		copy(en.Type[:], e[:16])
		copy(en.GUID[:], e[16:32])
		t.Entries = append(t.Entries, en)
	}
	return t, nil
}

// WriteTable writes a new GPT on f (of size bytes, in sector-byte sectors): a protective
// MBR, the primary header and entries, and the backup entries and header at the end. The
// entries are numbered in order. The backup is written before the primary, and both are
// synced: a table half-written by a power cut has no valid primary header, so it reads as
// no table at all, never as a wrong one.
func WriteTable(f *os.File, size, sector int64, diskGUID GUID, parts []Entry) error {
	lastLBA := size/sector - 1
	entryBytes := int64(gptEntries * gptEntrySize)
	entrySectors := (entryBytes + sector - 1) / sector
	firstUsable := 2 + entrySectors
	lastUsable := lastLBA - entrySectors - 1
	if len(parts) > gptEntries {
		return fmt.Errorf("%d partitions: a GPT holds %d", len(parts), gptEntries)
	}
	entries := make([]byte, entryBytes)
	for i, p := range parts {
		if p.First < firstUsable || p.Last > lastUsable || p.Last < p.First {
			return fmt.Errorf("partition %d (%s) at sectors %d-%d lies outside %d-%d", i+1, p.Name, p.First, p.Last, firstUsable, lastUsable)
		}
		e := entries[i*gptEntrySize:]
		copy(e[0:16], p.Type[:])
		copy(e[16:32], p.GUID[:])
		binary.LittleEndian.PutUint64(e[32:], uint64(p.First))
		binary.LittleEndian.PutUint64(e[40:], uint64(p.Last))
		name := utf16.Encode([]rune(p.Name))
		if len(name) > 36 {
			return fmt.Errorf("partition name %q is longer than 36 characters", p.Name)
		}
		for j, c := range name {
			binary.LittleEndian.PutUint16(e[56+2*j:], c)
		}
	}
	entriesCRC := crc32.ChecksumIEEE(entries)
	header := func(self, alternate, entriesLBA int64) []byte {
		h := make([]byte, sector)
		copy(h, "EFI PART")
		binary.LittleEndian.PutUint32(h[8:], 0x00010000)
		binary.LittleEndian.PutUint32(h[12:], 92)
		binary.LittleEndian.PutUint64(h[24:], uint64(self))
		binary.LittleEndian.PutUint64(h[32:], uint64(alternate))
		binary.LittleEndian.PutUint64(h[40:], uint64(firstUsable))
		binary.LittleEndian.PutUint64(h[48:], uint64(lastUsable))
		copy(h[56:72], diskGUID[:])
		binary.LittleEndian.PutUint64(h[72:], uint64(entriesLBA))
		binary.LittleEndian.PutUint32(h[80:], gptEntries)
		binary.LittleEndian.PutUint32(h[84:], gptEntrySize)
		binary.LittleEndian.PutUint32(h[88:], entriesCRC)
		binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
		return h
	}
	// The protective MBR: one partition of type 0xEE over the whole disk (UEFI 2.10, 5.2.3).
	mbr := make([]byte, sector)
	mbr[446+4] = 0xEE
	copy(mbr[446+1:446+4], []byte{0x00, 0x02, 0x00})
	copy(mbr[446+5:446+8], []byte{0xFF, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(mbr[446+8:], 1)
	n := uint32(0xFFFFFFFF)
	if lastLBA < 0xFFFFFFFF {
		n = uint32(lastLBA)
	}
	binary.LittleEndian.PutUint32(mbr[446+12:], n)
	mbr[510], mbr[511] = 0x55, 0xAA

	backupEntries := lastLBA - entrySectors
	for _, w := range []struct {
		at   int64
		data []byte
	}{
		{backupEntries * sector, entries},
		{lastLBA * sector, header(lastLBA, 1, backupEntries)},
	} {
		if _, err := f.WriteAt(w.data, w.at); err != nil {
			return fmt.Errorf("writing the backup GPT of %s: %w", f.Name(), err)
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	for _, w := range []struct {
		at   int64
		data []byte
	}{
		{0, mbr},
		{2 * sector, entries},
		{sector, header(1, lastLBA, 2)},
	} {
		if _, err := f.WriteAt(w.data, w.at); err != nil {
			return fmt.Errorf("writing the GPT of %s: %w", f.Name(), err)
		}
	}
	return f.Sync()
}

// ZeroRange writes zeros over [off, off+n) and syncs.
func ZeroRange(f *os.File, off, n int64) error {
	zero := make([]byte, 1<<20)
	for n > 0 {
		c := min(n, int64(len(zero)))
		if _, err := f.WriteAt(zero[:c], off); err != nil {
			return fmt.Errorf("zeroing %s at %d: %w", f.Name(), off, err)
		}
		off += c
		n -= c
	}
	return f.Sync()
}
