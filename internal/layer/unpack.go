package layer

import (
	"archive/tar"
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
)

// Limits bound what Unpack accepts.
type Limits struct {
	// MaxFileSize bounds one entry, MaxTotal all entries together (uncompressed), MaxFiles
	// the number of entries.
	MaxFileSize, MaxTotal int64
	MaxFiles              int
}

// DefaultLimits fit any real layer many times over and stop a hostile one early.
var DefaultLimits = Limits{MaxFileSize: 8 << 20, MaxTotal: 64 << 20, MaxFiles: 4096}

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
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, nil, fmt.Errorf("layer is not a gzip stream: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(gz, lim.MaxTotal+1<<20))
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
			return nil, nil, fmt.Errorf("layer entry %q appears twice", h.Name)
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
		return nil, nil, fmt.Errorf("layer is truncated or corrupt: %w", err)
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
		return nil, nil, fmt.Errorf("layer index has schema %q; this liken reads %q", idx.Schema, Schema)
	}
	listed := map[string]bool{}
	for _, f := range idx.Files {
		if listed[f.Name] {
			return nil, nil, fmt.Errorf("layer index lists %q twice", f.Name)
		}
		listed[f.Name] = true
		b, ok := files[f.Name]
		if !ok {
			return nil, nil, fmt.Errorf("layer index lists %q, which the layer does not hold", f.Name)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); int64(len(b)) != f.Size || got != f.SHA256 {
			return nil, nil, fmt.Errorf("layer entry %q does not match its index (tampered or damaged): expected %d bytes sha256:%s, got %d bytes sha256:%s", f.Name, f.Size, f.SHA256, len(b), got)
		}
		if f.Mode&^0o777 != 0 {
			return nil, nil, fmt.Errorf("layer entry %q has mode %o: only permission bits are allowed", f.Name, f.Mode)
		}
	}
	for _, n := range order[1:] {
		if !listed[n] {
			return nil, nil, fmt.Errorf("layer entry %q is not in its index", n)
		}
	}
	return idx, files, nil
}

// checkHeader accepts only regular files with clean, relative names.
func checkHeader(h *tar.Header, lim Limits) error {
	switch h.Typeflag {
	case tar.TypeReg:
	case tar.TypeSymlink:
		return fmt.Errorf("layer entry %q is a symbolic link: layers hold only regular files", h.Name)
	case tar.TypeLink:
		return fmt.Errorf("layer entry %q is a hard link: layers hold only regular files", h.Name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("layer entry %q is a device or pipe: layers hold only regular files", h.Name)
	default:
		return fmt.Errorf("layer entry %q has type %q: layers hold only regular files", h.Name, h.Typeflag)
	}
	n := h.Name
	if n == "" || strings.HasPrefix(n, "/") || strings.Contains(n, "\\") || strings.ContainsRune(n, 0) {
		return fmt.Errorf("layer entry %q: names must be relative paths", n)
	}
	if path.Clean(n) != n {
		return fmt.Errorf("layer entry %q: names must be clean paths", n)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." || part == "." {
			return fmt.Errorf("layer entry %q: names must not climb out of the layer", n)
		}
	}
	if h.Size < 0 || h.Size > lim.MaxFileSize {
		return fmt.Errorf("layer entry %q is %d bytes, more than the %d allowed", n, h.Size, lim.MaxFileSize)
	}
	return nil
}
