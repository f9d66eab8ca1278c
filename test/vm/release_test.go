package vm

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/release"
)

// TestReleaseBuildReproducible builds the release a second time from the same inputs: every
// file and so the digest must be identical.
func TestReleaseBuildReproducible(t *testing.T) {
	vmTest(t)
	first, err := BuildRelease(releaseA)
	if err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	cache, _ := os.UserCacheDir()
	dir := t.TempDir()
	digest, doc, err := release.Build(release.BuildOptions{
		Version: releaseA, Source: filepath.Join(filepath.Dir(file), "..", ".."), StandIn: true, TestSwitches: true, Out: dir,
		KernelCache: filepath.Join(cache, "liken", "kernel"), Epoch: time.Unix(1785000000, 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	if digest != first.Digest {
		for i, f := range doc.Files {
			if f.SHA256 != first.Doc.Files[i].SHA256 {
				t.Errorf("%s differs between two builds", f.Name)
			}
		}
		t.Fatalf("two builds from the same inputs: %s and %s", first.Digest, digest)
	}
	if !doc.Components.K3s.StandIn || doc.Components.K3s.Version != "stand-in" {
		t.Errorf("a stand-in release does not say so: %+v", doc.Components.K3s)
	}
	if doc.Components.Kernel.PackageSHA256 == "" || doc.Components.Kernel.Version == "" {
		t.Errorf("kernel package not recorded: %+v", doc.Components.Kernel)
	}
	// The images the nodes import, by name and digest (equal in both builds, as the
	// documents are).
	images := map[string]apirelease.Image{}
	for _, im := range doc.Components.Images {
		images[im.Name] = im
	}
	for _, name := range []string{release.PauseImageRef, apirelease.StandInCoreDNSImage} {
		im, ok := images[name]
		if !ok || !apirelease.ValidDigest(im.Digest) || filepath.Dir(im.Archive) != apirelease.StandInImagesDir {
			t.Errorf("the release document does not record image %s with its digest and archive: %+v", name, doc.Components.Images)
		}
	}
}
