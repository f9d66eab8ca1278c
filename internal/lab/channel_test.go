package lab

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/internal/standin/image"
	"liken.dev/liken/internal/syncbuf"
)

// source is liken's source tree, this package's two levels up.
func source() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TestDemoImageIsReproducible: the demo's image built twice from the same source has the same
// digest, and is named for the lab's registry.
func TestDemoImageIsReproducible(t *testing.T) {
	epoch := time.Unix(1785000000, 0)
	var digests []string
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := buildDemo(source(), dir, epoch); err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag(DemoImage)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(filepath.Join(dir, "liken-demo.tar"), &tag)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Errorf("the demo image built twice: digests %s and %s", digests[0], digests[1])
	}
}

// TestServeChannel: the lab's channel server serves the channel's files and, under /v2/, the
// image archives as a registry a client pulls from by the image's repository and tag, with
// the archive's digest; every request is logged.
func TestServeChannel(t *testing.T) {
	channel, images := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(channel, "release.json"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An image archive as the lab writes the demo's, with a small program for a file.
	if err := writeTestImage(filepath.Join(images, "liken-demo.tar")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var log syncbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- ServeChannel(ctx, l, channel, images, &log) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeChannel: %v", err)
		}
	}()
	addr := l.Addr().String()

	// The registry serves once the archive is pushed: poll for the image.
	ref, err := name.NewTag(addr+"/liken-demo:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	want, err := tarball.ImageFromPath(filepath.Join(images, "liken-demo.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, _ := want.Digest()
	deadline := time.Now().Add(30 * time.Second)
	for {
		img, err := remote.Image(ref, remote.WithContext(ctx))
		if err == nil {
			d, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if d != wantDigest {
				t.Errorf("the registry serves %s, the archive holds %s", d, wantDigest)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pulling %s: %v", ref, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr + "/release.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "{}\n" {
		t.Errorf("GET /release.json: %s %q", resp.Status, b)
	}
	for _, w := range []string{"GET /v2/liken-demo/manifests/1", "GET /release.json", "serving image " + DemoImage} {
		if !strings.Contains(log.String(), w) {
			t.Errorf("the log does not say %q:\n%s", w, log.String())
		}
	}
}

// TestServeChannelRefusesABadArchive: an archive that is not an image stops the server with
// an error naming it, rather than serving a registry without it.
func TestServeChannelRefusesABadArchive(t *testing.T) {
	images := t.TempDir()
	if err := os.WriteFile(filepath.Join(images, "broken.tar"), []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = ServeChannel(t.Context(), l, t.TempDir(), images, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "broken.tar") {
		t.Errorf("ServeChannel with a broken archive: %v, want an error naming broken.tar", err)
	}
}

// TestDemoManifest: the demo's manifest, as lab up writes it, holds the Deployment (two
// replicas, the lab's image), the budget, and the Service on DemoNodePort, local traffic.
func TestDemoManifest(t *testing.T) {
	b, err := DemoManifest()
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	if len(docs) != 3 {
		t.Fatalf("%d documents, want 3:\n%s", len(docs), b)
	}
	var kinds []string
	for _, d := range docs {
		var o struct {
			Kind string
			Spec map[string]any
		}
		if err := yaml.Unmarshal([]byte(d), &o); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, o.Kind)
	}
	if strings.Join(kinds, ",") != "Deployment,PodDisruptionBudget,Service" {
		t.Errorf("kinds %v", kinds)
	}
	for _, w := range []string{"image: " + DemoImage, "replicas: 2", fmt.Sprintf("nodePort: %d", DemoNodePort), "externalTrafficPolicy: Local", "minAvailable: 1"} {
		if !bytes.Contains(b, []byte(w)) {
			t.Errorf("the manifest has no %q:\n%s", w, b)
		}
	}
}

// writeTestImage writes an image archive named DemoImage holding one small file.
func writeTestImage(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := image.WriteArchive(f, image.Spec{Ref: DemoImage, Entrypoint: []string{"/hello"},
		Files: []image.File{{Path: "/hello", Mode: 0o755, Data: []byte("#!/hello\n")}}, Epoch: time.Unix(1785000000, 0)}); err != nil {
		return err
	}
	return f.Close()
}
