// Package cpio writes "newc" cpio archives, the format the Linux kernel unpacks as an
// initramfs, reproducibly: the caller gives entries in order, and every entry gets owner
// 0:0, time 0 and a sequential inode number, so equal inputs give equal bytes.
package cpio

import (
	"fmt"
	"io"
)

// File modes (the S_IF* bits).
const (
	ModeDir     = 0o040000
	ModeRegular = 0o100000
	ModeSymlink = 0o120000
	ModeChar    = 0o020000
)

// Writer writes a newc archive.
type Writer struct {
	w   io.Writer
	ino uint32
	err error
}

// NewWriter starts an archive on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Entry is one archive member.
type Entry struct {
	Name string // without a leading "/"
	Mode uint32 // type and permission bits
	Data []byte // contents (regular files) or target (symlinks)
	// RdevMajor and RdevMinor are a device node's numbers.
	RdevMajor, RdevMinor uint32
}

// Write appends an entry.
func (w *Writer) Write(e Entry) error {
	if w.err != nil {
		return w.err
	}
	w.ino++
	nlink := uint32(1)
	if e.Mode&0o170000 == ModeDir {
		nlink = 2
	}
	name := e.Name + "\x00"
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, e.Mode, 0, 0, nlink, 0, len(e.Data), 0, 0, e.RdevMajor, e.RdevMinor, len(name), 0)
	w.write([]byte(hdr))
	w.write([]byte(name))
	w.pad(len(hdr) + len(name))
	w.write(e.Data)
	w.pad(len(e.Data))
	return w.err
}

// Close writes the trailer.
func (w *Writer) Close() error {
	w.ino = 0 // the trailer's fields are all zero, as the kernel's own tools write it
	name := "TRAILER!!!\x00"
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, len(name), 0)
	w.write([]byte(hdr))
	w.write([]byte(name))
	w.pad(len(hdr) + len(name))
	return w.err
}

func (w *Writer) write(b []byte) {
	if w.err == nil {
		_, w.err = w.w.Write(b)
	}
}

// pad aligns to 4 bytes after n bytes.
func (w *Writer) pad(n int) {
	if r := n % 4; r != 0 {
		w.write(make([]byte, 4-r))
	}
}
