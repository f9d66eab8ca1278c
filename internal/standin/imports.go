package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"liken.dev/liken/internal/atomicfile"
)

// The release's image archives are imported once, not at every k3s start: k3s's conditional
// image imports (docs.k3s.io/import-images, "Conditional Image Imports": an archive whose size
// and modification time are as at its last import is not imported again) are opt-in there
// because an image pruned since is then missing; the stand-in also asks containerd whether
// the archive's images are still there, and imports again when one is not. The record lives
// under containerd's root, so a store wiped is a record wiped. Operators' archives in
// agent/images are imported at every start, as k3s does by default.
//
// importsFile is that record, in containerd's root.
const importsFile = "liken-standin-imports.json"

// importRecord is what an archive was when it was imported, and the images it held.
type importRecord struct {
	Size    int64     `json:"size"`
	ModTime time.Time `json:"modTime"`
	Images  []string  `json:"images"`
}

// importsMu orders the record's reads and writes: the release's first archives and the
// later ones are imported by different goroutines.
var importsMu sync.Mutex

func (n *Node) importsPath() string { return n.agent("containerd", importsFile) }

func (n *Node) readImports() map[string]importRecord {
	recs := map[string]importRecord{}
	b, err := os.ReadFile(n.importsPath())
	if err == nil && json.Unmarshal(b, &recs) != nil {
		recs = map[string]importRecord{} // unreadable: import everything again, and rewrite it
	}
	return recs
}

// archiveImages names the images a docker-format archive holds (its manifest.json's tags),
// normalised as go-containerregistry names them.
func archiveImages(path string) ([]string, error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		return nil, fmt.Errorf("reading the images %s holds: %w", path, err)
	}
	var out []string
	for _, d := range m {
		for _, tag := range d.RepoTags {
			ref, err := name.ParseReference(tag)
			if err != nil {
				return nil, fmt.Errorf("%s holds an image named %q: %w", path, tag, err)
			}
			out = append(out, ref.Name())
		}
	}
	if len(out) == 0 {
		return nil, errors.New(path + " names no image (manifest.json has no RepoTags)")
	}
	return out, nil
}

// presentImages lists the images containerd's k8s.io namespace holds, normalised.
func (n *Node) presentImages(ctx context.Context, ctr string) (map[string]bool, error) {
	out, err := exec.CommandContext(ctx, ctr, "--address", n.ContainerdSocket(), "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		return nil, fmt.Errorf("listing containerd's images: %w", err)
	}
	present := map[string]bool{}
	for _, l := range strings.Fields(string(out)) {
		if ref, err := name.ParseReference(l); err == nil {
			present[ref.Name()] = true
		}
	}
	return present, nil
}

// alreadyImported says whether archive was imported as it is now and its images are all
// still in containerd; with the images it holds, for the record after an import.
func (n *Node) alreadyImported(ctx context.Context, ctr, archive string, recs map[string]importRecord) (bool, importRecord, error) {
	fi, err := os.Stat(archive)
	if err != nil {
		return false, importRecord{}, err
	}
	now := importRecord{Size: fi.Size(), ModTime: fi.ModTime().UTC()}
	if rec, ok := recs[archive]; ok && rec.Size == now.Size && rec.ModTime.Equal(now.ModTime) && len(rec.Images) > 0 {
		present, err := n.presentImages(ctx, ctr)
		if err != nil {
			return false, now, err
		}
		all := true
		for _, img := range rec.Images {
			all = all && present[img]
		}
		if all {
			return true, rec, nil
		}
	}
	if now.Images, err = archiveImages(archive); err != nil {
		return false, now, err
	}
	return false, now, nil
}

// recordImport notes that archive was imported as rec says.
func (n *Node) recordImport(archive string, rec importRecord) error {
	importsMu.Lock()
	defer importsMu.Unlock()
	recs := n.readImports()
	recs[archive] = rec
	b, err := json.MarshalIndent(recs, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(n.importsPath(), append(b, '\n'), 0o600)
}
