package layer

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Limits bound what Read and Unpack accept. A zero field takes DefaultLimits' value.
type Limits struct {
	// MaxFileSize bounds one entry, MaxTotal all entries together (uncompressed), MaxFiles
	// the number of entries.
	MaxFileSize, MaxTotal int64
	MaxFiles              int
	// MaxCompressed bounds the bytes read (the layer as stored); the whole gzip stream, what
	// follows the archive too, decompresses to at most MaxTotal and 1 MiB of archive framing.
	MaxCompressed int64
	// MaxName bounds an entry's name, in bytes.
	MaxName int
}

// DefaultLimits fit any real layer many times over and stop a hostile one early.
var DefaultLimits = Limits{MaxFileSize: 8 << 20, MaxTotal: 64 << 20, MaxFiles: 4096, MaxCompressed: 64 << 20, MaxName: 255}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.MaxFileSize == 0 {
		l.MaxFileSize = d.MaxFileSize
	}
	if l.MaxTotal == 0 {
		l.MaxTotal = d.MaxTotal
	}
	if l.MaxFiles == 0 {
		l.MaxFiles = d.MaxFiles
	}
	if l.MaxCompressed == 0 {
		l.MaxCompressed = d.MaxCompressed
	}
	if l.MaxName == 0 {
		l.MaxName = d.MaxName
	}
	return l
}

// bounded reads at most n bytes from r and fails, naming what, past them: a hostile layer
// stops early, with a message that says which limit it hit.
type bounded struct {
	r    io.Reader
	n    int64
	what string
}

func (b *bounded) Read(p []byte) (int, error) {
	if b.n <= 0 {
		// One byte more tells a layer of exactly n bytes from a larger one.
		var one [1]byte
		if k, _ := b.r.Read(one[:]); k > 0 {
			return 0, errors.New(b.what)
		}
		return b.r.Read(p)
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	k, err := b.r.Read(p)
	b.n -= int64(k)
	return k, err
}

// Open opens a layer file for Read: a regular file no larger than lim allows, opened without
// blocking (a FIFO is refused, not waited on). It returns the file and its size.
func Open(name string, lim Limits) (*os.File, int64, error) {
	lim = lim.withDefaults()
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the layer: %w", err)
	}
	st, err := f.Stat()
	switch {
	case err != nil:
		f.Close()
		return nil, 0, fmt.Errorf("reading the layer: %w", err)
	case !st.Mode().IsRegular():
		f.Close()
		return nil, 0, fmt.Errorf("reading the layer: %s is not a regular file (%s)", name, st.Mode().Type())
	case st.Size() > lim.MaxCompressed:
		f.Close()
		return nil, 0, fmt.Errorf("reading the layer: %s is %d bytes, more than the %d a layer may have", name, st.Size(), lim.MaxCompressed)
	}
	return f, st.Size(), nil
}

// Unpack checks the whole layer from r, then writes it to dir: into a new directory beside
// dir, synced, then renamed over it. An invalid layer is refused with nothing written. It
// returns the layer's index.
func Unpack(r io.Reader, dir string, lim Limits) (*Index, error) {
	idx, files, err := Read(r, lim)
	if err != nil {
		return nil, err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".new-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, f := range idx.Files {
		p := filepath.Join(tmp, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := writeSynced(p, files[f.Name], os.FileMode(f.Mode)); err != nil {
			return nil, err
		}
	}
	if err := writeSynced(filepath.Join(tmp, IndexName), files[IndexName], 0o644); err != nil {
		return nil, err
	}
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			os.Rename(old, dir)
		}
		return nil, fmt.Errorf("installing the layer: %w", err)
	}
	if old != "" {
		os.RemoveAll(old)
	}
	return idx, nil
}

func writeSynced(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Read checks a whole layer in memory (bounded by lim) and returns its index and files.
// Every entry must be a regular file with a clean relative name, listed once in layer.json
// with its size, SHA-256 and mode; nothing may be missing or extra.
func Read(r io.Reader, lim Limits) (*Index, map[string][]byte, error) {
	lim = lim.withDefaults()
	// gzip reads a ByteReader without reading ahead, so what is left in br after the
	// stream is exactly what follows it.
	br := bufio.NewReader(&bounded{r: r, n: lim.MaxCompressed, what: fmt.Sprintf("layer is larger than %d bytes as stored", lim.MaxCompressed)})
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, nil, fmt.Errorf("layer is not a gzip stream: %w", err)
	}
	zr.Multistream(false)
	// Everything decompressed counts, what follows the archive's end too.
	gz := &bounded{r: zr, n: lim.MaxTotal + 1<<20, what: fmt.Sprintf("layer decompresses to more than %d bytes", lim.MaxTotal+1<<20)}
	tr := tar.NewReader(gz)
	files := map[string][]byte{}
	var order []string
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("layer is truncated or corrupt: %w", err)
		}
		if err := checkHeader(h, lim); err != nil {
			return nil, nil, err
		}
		if _, dup := files[h.Name]; dup {
			return nil, nil, fmt.Errorf("layer entry %+q appears twice", h.Name)
		}
		if len(files) >= lim.MaxFiles {
			return nil, nil, fmt.Errorf("layer has more than %d entries", lim.MaxFiles)
		}
		total += h.Size
		if total > lim.MaxTotal {
			return nil, nil, fmt.Errorf("layer is larger than %d bytes", lim.MaxTotal)
		}
		b, err := io.ReadAll(io.LimitReader(tr, h.Size+1))
		if err != nil {
			return nil, nil, fmt.Errorf("layer is truncated: reading %s: %w", h.Name, err)
		}
		if int64(len(b)) != h.Size {
			return nil, nil, fmt.Errorf("layer is truncated: %s has %d of %d bytes", h.Name, len(b), h.Size)
		}
		files[h.Name] = b
		order = append(order, h.Name)
	}
	// Reading to the end checks gzip's own CRC and length.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		if strings.HasPrefix(err.Error(), "layer ") {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("layer is truncated or corrupt: %w", err)
	}
	// Nothing may follow the gzip stream (Multistream is off, so a second one is not read).
	if _, err := br.ReadByte(); err == nil {
		return nil, nil, errors.New("layer has bytes after its gzip stream")
	} else if err != io.EOF {
		return nil, nil, err
	}
	if len(order) == 0 || order[0] != IndexName {
		return nil, nil, fmt.Errorf("layer does not start with %s", IndexName)
	}
	idx := &Index{}
	dec := json.NewDecoder(bytes.NewReader(files[IndexName]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(idx); err != nil {
		return nil, nil, fmt.Errorf("layer index is malformed: %w", err)
	}
	if idx.Schema != Schema {
		return nil, nil, fmt.Errorf("layer index has schema %+q; this liken reads %+q", idx.Schema, Schema)
	}
	listed := map[string]bool{}
	for _, f := range idx.Files {
		if listed[f.Name] {
			return nil, nil, fmt.Errorf("layer index lists %+q twice", f.Name)
		}
		listed[f.Name] = true
		b, ok := files[f.Name]
		if !ok {
			return nil, nil, fmt.Errorf("layer index lists %+q, which the layer does not hold", f.Name)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); int64(len(b)) != f.Size || got != f.SHA256 {
			return nil, nil, fmt.Errorf("layer entry %+q does not match its index (tampered or damaged): expected %d bytes sha256:%s, got %d bytes sha256:%s", f.Name, f.Size, f.SHA256, len(b), got)
		}
		if f.Mode&^0o777 != 0 {
			return nil, nil, fmt.Errorf("layer entry %+q has mode %o: only permission bits are allowed", f.Name, f.Mode)
		}
	}
	for _, n := range order[1:] {
		if !listed[n] {
			return nil, nil, fmt.Errorf("layer entry %+q is not in its index", n)
		}
	}
	return idx, files, nil
}

// checkHeader accepts only regular files with clean, relative names.
func checkHeader(h *tar.Header, lim Limits) error {
	switch h.Typeflag {
	case tar.TypeReg:
	case tar.TypeSymlink:
		return fmt.Errorf("layer entry %+q is a symbolic link: layers hold only regular files", h.Name)
	case tar.TypeLink:
		return fmt.Errorf("layer entry %+q is a hard link: layers hold only regular files", h.Name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("layer entry %+q is a device or pipe: layers hold only regular files", h.Name)
	default:
		return fmt.Errorf("layer entry %+q has type %+q: layers hold only regular files", h.Name, h.Typeflag)
	}
	n := h.Name
	if len(n) > lim.MaxName {
		return fmt.Errorf("layer entry %+q... has a name of %d bytes, more than the %d allowed", n[:40], len(n), lim.MaxName)
	}
	if n == "" || strings.HasPrefix(n, "/") || strings.Contains(n, "\\") || strings.ContainsRune(n, 0) {
		return fmt.Errorf("layer entry %+q: names must be relative paths", n)
	}
	if path.Clean(n) != n {
		return fmt.Errorf("layer entry %+q: names must be clean paths", n)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." || part == "." {
			return fmt.Errorf("layer entry %+q: names must not climb out of the layer", n)
		}
	}
	if h.Size < 0 || h.Size > lim.MaxFileSize {
		return fmt.Errorf("layer entry %+q is %d bytes, more than the %d allowed", n, h.Size, lim.MaxFileSize)
	}
	return nil
}
