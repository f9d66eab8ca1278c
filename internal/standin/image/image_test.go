package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func spec() Spec {
	return Spec{Ref: "docker.io/rancher/mirrored-pause:3.6", Entrypoint: []string{"/pause"}, User: "65535:65535",
		Epoch: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Files: []File{{Path: "/pause", Mode: 0o755, Data: []byte("a program")}, {Path: "/etc/liken/image", Mode: 0o644, Data: []byte("pause\n")}}}
}

// TestArchiveReproducible: the same spec gives the same bytes and digest twice (the
// issue's reproducibility check), and any change of content, time or config another.
func TestArchiveReproducible(t *testing.T) {
	write := func(s Spec) (string, []byte) {
		t.Helper()
		var b bytes.Buffer
		d, err := WriteArchive(&b, s)
		if err != nil {
			t.Fatal(err)
		}
		return d, b.Bytes()
	}
	d1, a1 := write(spec())
	d2, a2 := write(spec())
	if d1 != d2 || !bytes.Equal(a1, a2) {
		t.Fatalf("two builds of one spec differ: %s and %s", d1, d2)
	}
	for _, tt := range []struct {
		name   string
		change func(*Spec)
	}{
		{"content", func(s *Spec) { s.Files[0].Data = []byte("another program") }},
		{"mode", func(s *Spec) { s.Files[0].Mode = 0o700 }},
		{"epoch", func(s *Spec) { s.Epoch = s.Epoch.Add(time.Second) }},
		{"entrypoint", func(s *Spec) { s.Entrypoint = []string{"/pause", "-v"} }},
		{"user", func(s *Spec) { s.User = "0:0" }},
	} {
		s := spec()
		tt.change(&s)
		if d, _ := write(s); d == d1 {
			t.Errorf("a changed %s kept the digest %s", tt.name, d)
		}
	}
}

// TestArchiveReadsBack: the archive, read as containerd's import reads a docker-save
// archive, is the image under its name, with the config and the files, owned by root, in
// name order with their directories.
func TestArchiveReadsBack(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pause.tar")
	f, _ := os.Create(p)
	d, err := WriteArchive(f, spec())
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(spec().Ref)
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got.String() != d {
		t.Errorf("read back as %s, written as %s", got, d)
	}
	cf, _ := img.ConfigFile()
	if !slices.Equal(cf.Config.Entrypoint, []string{"/pause"}) || cf.Config.User != "65535:65535" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config %+v", cf.Config)
	}
	tr := tar.NewReader(mutate.Extract(img))
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(spec().Epoch) {
			t.Errorf("%s: owner %d:%d, time %s", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		if h.Name == "pause" {
			b, _ := io.ReadAll(tr)
			if string(b) != "a program" || h.Mode != 0o755 {
				t.Errorf("pause: %q mode %o", b, h.Mode)
			}
		}
	}
	if want := []string{"etc", "etc/liken", "etc/liken/image", "pause"}; !slices.Equal(names, want) {
		t.Errorf("layer entries %v, want %v", names, want)
	}
}

func TestBuildRefuses(t *testing.T) {
	for _, tt := range []struct {
		name, want string
		change     func(*Spec)
	}{
		{"relative path", "want a clean absolute path", func(s *Spec) { s.Files[0].Path = "pause" }},
		{"unclean path", "want a clean absolute path", func(s *Spec) { s.Files[0].Path = "/x/../pause" }},
		{"the same file twice", "given twice", func(s *Spec) { s.Files[1].Path = "/pause" }},
		{"a bad name", "image name", func(s *Spec) { s.Ref = "Not A Name" }},
	} {
		s := spec()
		tt.change(&s)
		if _, err := WriteArchive(io.Discard, s); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one saying %q", tt.name, err, tt.want)
		}
	}
}
