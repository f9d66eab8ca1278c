package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ServeChannel serves a lab's channel directory over HTTP on l and, under /v2/, an image
// registry (go-containerregistry's, in memory) holding the image archives in images (the
// demo's), which the machines pull through the Cluster's mirror for DemoRegistry. Each
// request goes on log: what the machines fetched, and when. It returns when ctx ends or the
// server fails.
func ServeChannel(ctx context.Context, l net.Listener, channel, images string, logw io.Writer) error {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	files := http.FileServer(http.Dir(channel))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(logw, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339), r.Method, r.URL.Path)
		if r.URL.Path == "/v2" || strings.HasPrefix(r.URL.Path, "/v2/") {
			reg.ServeHTTP(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	if images != "" {
		if err := pushArchives(ctx, l.Addr().String(), images, logw); err != nil {
			srv.Close()
			return err
		}
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		srv.Close()
		return nil
	}
}

// pushArchives puts every image archive (*.tar, as docker save writes them) in dir into the
// registry at addr, under the repository and tag its name has, whatever its registry host.
func pushArchives(ctx context.Context, addr, dir string, logw io.Writer) error {
	archives, err := filepath.Glob(filepath.Join(dir, "*.tar"))
	if err != nil {
		return err
	}
	sort.Strings(archives)
	for _, a := range archives {
		opener := func() (io.ReadCloser, error) { return os.Open(a) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return fmt.Errorf("reading image archive %s: %w", a, err)
		}
		if len(m) != 1 || len(m[0].RepoTags) != 1 {
			return fmt.Errorf("image archive %s: want one image with one name", a)
		}
		ref, err := name.NewTag(m[0].RepoTags[0])
		if err != nil {
			return fmt.Errorf("image archive %s: %w", a, err)
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return fmt.Errorf("reading image archive %s: %w", a, err)
		}
		to, err := name.NewTag(fmt.Sprintf("%s/%s:%s", addr, ref.RepositoryStr(), ref.TagStr()), name.Insecure)
		if err != nil {
			return err
		}
		if err := remote.Write(to, img, remote.WithContext(ctx)); err != nil {
			return fmt.Errorf("serving %s: %w", ref, err)
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintf(logw, "%s serving image %s (%s) from %s\n", time.Now().UTC().Format(time.RFC3339), ref, d, a)
	}
	if len(archives) == 0 {
		return errors.New("no image archives in " + dir)
	}
	return nil
}
