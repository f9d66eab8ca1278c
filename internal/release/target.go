package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Target is where a fetched file goes.
type Target interface {
	// Begin opens the target for writing from its start, refusing a target in use.
	Begin() (Sink, error)
}

// Sink receives a file's bytes in order.
type Sink interface {
	Write(p []byte) (int, error)
	// Commit makes the verified bytes durable and visible.
	Commit() error
	// Discard throws away what was written (the file did not verify).
	Discard() error
}

// FileTarget writes a regular file: into a temporary file beside it, renamed over Path only
// once every byte verified, so the file at Path (perhaps in use) is never written in place.
type FileTarget struct {
	Path string
	Mode os.FileMode
}

// Begin implements Target.
func (t FileTarget) Begin() (Sink, error) {
	if err := os.MkdirAll(filepath.Dir(t.Path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(t.Path), "."+filepath.Base(t.Path)+".partial-*")
	if err != nil {
		return nil, err
	}
	mode := t.Mode
	if mode == 0 {
		mode = 0o644
	}
	return &fileSink{f: f, path: t.Path, mode: mode}, nil
}

type fileSink struct {
	f    *os.File
	path string
	mode os.FileMode
}

func (s *fileSink) Write(p []byte) (int, error) { return s.f.Write(p) }

func (s *fileSink) Commit() error {
	if err := s.f.Chmod(s.mode); err != nil {
		s.Discard()
		return err
	}
	if err := s.f.Sync(); err != nil {
		s.Discard()
		return fmt.Errorf("syncing %s: %w", s.path, err)
	}
	if err := s.f.Close(); err != nil {
		os.Remove(s.f.Name())
		return err
	}
	if err := os.Rename(s.f.Name(), s.path); err != nil {
		os.Remove(s.f.Name())
		return err
	}
	d, err := os.Open(filepath.Dir(s.path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *fileSink) Discard() error {
	s.f.Close()
	if err := os.Remove(s.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// PartitionTarget writes a region of a disk (a partition of a block device or of a disk
// image file): from Offset, at most Size bytes. A block device is opened exclusively, which
// fails while the kernel holds it (mounted, or part of another device), so a slot in use is
// never written. A file that does not verify has the region's first MiB zeroed, so nothing
// takes the partial copy for a release.
type PartitionTarget struct {
	Path         string
	Offset, Size int64
}

// Begin implements Target.
func (t PartitionTarget) Begin() (Sink, error) {
	flags := unix.O_WRONLY | unix.O_CLOEXEC
	if st, err := os.Stat(t.Path); err == nil && st.Mode()&os.ModeDevice != 0 {
		flags |= unix.O_EXCL
	}
	fd, err := unix.Open(t.Path, flags, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("%s is in use (mounted or held): refusing to write it", t.Path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", t.Path, err)
	}
	return &regionSink{f: os.NewFile(uintptr(fd), t.Path), off: t.Offset, size: t.Size}, nil
}

type regionSink struct {
	f         *os.File
	off, size int64
	n         int64
}

func (s *regionSink) Write(p []byte) (int, error) {
	if s.n+int64(len(p)) > s.size {
		return 0, fmt.Errorf("%s: %d bytes do not fit the %d-byte partition", s.f.Name(), s.n+int64(len(p)), s.size)
	}
	n, err := s.f.WriteAt(p, s.off+s.n)
	s.n += int64(n)
	return n, err
}

func (s *regionSink) Commit() error {
	if err := s.f.Sync(); err != nil {
		s.f.Close()
		return fmt.Errorf("syncing %s: %w", s.f.Name(), err)
	}
	return s.f.Close()
}

func (s *regionSink) Discard() error {
	defer s.f.Close()
	n := min(int64(1<<20), s.size)
	if _, err := s.f.WriteAt(make([]byte, n), s.off); err != nil {
		return fmt.Errorf("invalidating %s: %w", s.f.Name(), err)
	}
	return s.f.Sync()
}

// Hash returns the hex SHA-256 of the region's first size bytes, read from the disk: cached
// pages are dropped first, so a region damaged since it was written does not hash as it was.
// progress hears the bytes read so far.
func (t PartitionTarget) Hash(ctx context.Context, size int64, progress func(int64)) (string, error) {
	f, err := os.Open(t.Path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", t.Path, err)
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), t.Offset, size, unix.FADV_DONTNEED)
	h := sha256.New()
	r := io.NewSectionReader(f, t.Offset, size)
	buf := make([]byte, bufferSize)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		k, err := r.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		progress(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", t.Path, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
