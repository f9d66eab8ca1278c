// Package image builds the container images a stand-in node needs with no registry on the
// internet (the pause image, and later CoreDNS and the lab's demo), as k3s's air-gap path
// expects them: docker-save archives that containerd imports from agent/images. An image is
// one layer of given files and a config; the same inputs give the same digest, byte for byte,
// whenever and wherever it is built.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// File is one file of the image's layer.
type File struct {
	Path string // absolute, in the image
	Mode int64  // permission bits
	Data []byte
}

// Spec says what an image holds.
type Spec struct {
	Ref        string // the name it is imported as, e.g. docker.io/rancher/mirrored-pause:3.6
	Files      []File
	Entrypoint []string
	User       string // e.g. 65535:65535
	// Epoch is every time the image records (the layer's files, the config's creation):
	// a release's build time, so nothing depends on when it was built.
	Epoch time.Time
}

// Build makes the image.
func Build(s Spec) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		b, err := layerTar(s)
		return io.NopCloser(bytes.NewReader(b)), err
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: the layer: %w", s.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: s.Epoch.UTC()}
	cf.Config.Entrypoint = s.Entrypoint
	cf.Config.User = s.User
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("image %s: the config: %w", s.Ref, err)
	}
	return img, nil
}

// layerTar is the layer's tar: the files and their parent directories in name order, owned
// by root, every time the epoch.
func layerTar(s Spec) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range s.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("image %s: file path %q: want a clean absolute path", s.Ref, f.Path)
		}
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	type entry struct {
		name string
		file *File
	}
	var entries []entry
	for d := range dirs {
		entries = append(entries, entry{name: strings.TrimPrefix(d, "/") + "/"})
	}
	for i := range s.Files {
		entries = append(entries, entry{name: strings.TrimPrefix(s.Files[i].Path, "/"), file: &s.Files[i]})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, e := range entries {
		if i > 0 && entries[i-1].name == e.name {
			return nil, fmt.Errorf("image %s: %s given twice", s.Ref, e.name)
		}
		h := &tar.Header{Name: e.name, ModTime: s.Epoch.UTC(), Format: tar.FormatPAX, Typeflag: tar.TypeDir, Mode: 0o755}
		if e.file != nil {
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, e.file.Mode, int64(len(e.file.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if e.file != nil {
			if _, err := tw.Write(e.file.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteArchive writes the image as a docker-save archive tagged s.Ref, which containerd's
// import (and k3s's agent/images) takes, and returns the image's digest.
func WriteArchive(w io.Writer, s Spec) (string, error) {
	ref, err := name.NewTag(s.Ref)
	if err != nil {
		return "", fmt.Errorf("image name %q: %w", s.Ref, err)
	}
	img, err := Build(s)
	if err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	if err := tarball.Write(ref, img, w); err != nil {
		return "", fmt.Errorf("writing image %s: %w", s.Ref, err)
	}
	return d.String(), nil
}
