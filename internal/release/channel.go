package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/atomicfile"
)

// Publish lays the release in releaseDir (release.json and its files) out under
// channelDir/<version>/, after checking every file against the document, and adds it to the
// channel's index. Releases are immutable: publishing a version again is a no-op when the
// document is the same and an error when it differs. It returns the release's digest.
func Publish(channelDir, releaseDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(releaseDir, apirelease.DocumentName))
	if err != nil {
		return "", fmt.Errorf("reading the release: %w", err)
	}
	doc, err := apirelease.Decode(raw)
	if err != nil {
		return "", fmt.Errorf("%s: %w", releaseDir, err)
	}
	digest := apirelease.Digest(raw)
	for _, f := range doc.Files {
		if err := checkFile(filepath.Join(releaseDir, f.Name), f); err != nil {
			return "", err
		}
	}
	dest := filepath.Join(channelDir, doc.Version)
	if old, err := os.ReadFile(filepath.Join(dest, apirelease.DocumentName)); err == nil {
		if apirelease.Digest(old) != digest {
			return "", fmt.Errorf("release %s is already in the channel with digest %s, not %s: a published release never changes; build a new version", doc.Version, apirelease.Digest(old), digest)
		}
		return digest, addToIndex(channelDir, doc, digest)
	}
	if err := os.MkdirAll(channelDir, 0o755); err != nil {
		return "", err
	}
	// Copy into a hidden directory and rename it into place: a reader never sees half a
	// release.
	tmp, err := os.MkdirTemp(channelDir, "."+doc.Version+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, f := range doc.Files {
		if err := copyFile(filepath.Join(releaseDir, f.Name), filepath.Join(tmp, f.Name)); err != nil {
			return "", err
		}
	}
	if err := atomicfile.Write(filepath.Join(tmp, apirelease.DocumentName), raw, 0o644); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dest); err != nil {
		return "", fmt.Errorf("publishing %s: %w", doc.Version, err)
	}
	return digest, addToIndex(channelDir, doc, digest)
}

func checkFile(path string, f apirelease.File) error {
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("release file %s: %w", f.Name, err)
	}
	defer fh.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, fh, make([]byte, bufferSize))
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.Name, err)
	}
	if n != f.Size {
		return fmt.Errorf("release file %s is %d bytes; its document says %d", f.Name, n, f.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return &apirelease.MismatchError{File: f.Name, Expected: "sha256:" + f.SHA256, Actual: "sha256:" + got}
	}
	return nil
}

func copyFile(src, dst string) error {
	_, err := CopyFileSum(src, dst)
	return err
}

// CopyFileSum copies src to a new file dst, synced, and returns the SHA-256 of what it
// copied, read once.
func CopyFileSum(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.CopyBuffer(io.MultiWriter(out, h), in, make([]byte, bufferSize)); err != nil {
		out.Close()
		return "", fmt.Errorf("copying %s: %w", src, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), out.Close()
}

func addToIndex(channelDir string, doc *apirelease.Document, digest string) error {
	path := filepath.Join(channelDir, apirelease.IndexName)
	idx := apirelease.Index{Schema: apirelease.IndexSchema}
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &idx); err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kept := idx.Releases[:0]
	for _, e := range idx.Releases {
		if e.Version != doc.Version {
			kept = append(kept, e)
		}
	}
	idx.Releases = append(kept, apirelease.IndexEntry{Version: doc.Version, Digest: digest, Created: doc.Created})
	sort.Slice(idx.Releases, func(i, j int) bool { return idx.Releases[i].Version < idx.Releases[j].Version })
	b, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, append(b, '\n'), 0o644)
}

// Pin fetches a release's document from a channel and returns its digest, after checking it
// is a valid document of that version and agrees with the channel's index.
func Pin(ctx context.Context, f *Fetcher, channel, version string) (string, *apirelease.Document, error) {
	if !apirelease.ValidVersion(version) {
		return "", nil, fmt.Errorf("%q is not a release version such as 2026.07.20-001", version)
	}
	raw, err := f.Raw(ctx, channel, version+"/"+apirelease.DocumentName, apirelease.MaxDocumentSize)
	if err != nil {
		return "", nil, err
	}
	doc, err := apirelease.Decode(raw)
	if err != nil {
		return "", nil, fmt.Errorf("release %s: %w", version, err)
	}
	if doc.Version != version {
		return "", nil, fmt.Errorf("release %s: its document says version %s", version, doc.Version)
	}
	digest := apirelease.Digest(raw)
	if b, err := f.Raw(ctx, channel, apirelease.IndexName, 16<<20); err == nil {
		var idx apirelease.Index
		if err := json.Unmarshal(b, &idx); err != nil {
			return "", nil, fmt.Errorf("channel index: %w", err)
		}
		for _, e := range idx.Releases {
			if e.Version == version && e.Digest != digest {
				return "", nil, fmt.Errorf("release %s: the channel index says %s but release.json is %s: the channel is inconsistent", version, e.Digest, digest)
			}
		}
	}
	return digest, doc, nil
}

// Verify fetches a whole release and checks every byte against pin, keeping nothing.
func Verify(ctx context.Context, f *Fetcher, channel, version, pin string) (*apirelease.Document, error) {
	return f.Release(ctx, channel, version, pin, func(apirelease.File) (Target, error) { return discard{}, nil })
}

type discard struct{}

func (discard) Begin() (Sink, error) { return discardSink{}, nil }

type discardSink struct{}

func (discardSink) Write(p []byte) (int, error) { return len(p), nil }
func (discardSink) Commit() error               { return nil }
func (discardSink) Discard() error              { return nil }
