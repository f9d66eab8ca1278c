package standin

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"liken.dev/liken/internal/standin/image"
)

// TestRegistryHosts: each mirror of a registries file becomes one hosts.toml, its endpoints
// in order with their hosts' TLS settings, the registry itself as the server (docker.io's
// is registry-1.docker.io), "*" the _default directory; rewrites, which upstream containerd
// lacks, are left out and named; endpoints that are not URLs are refused.
func TestRegistryHosts(t *testing.T) {
	hosts, ignored, err := RegistryHosts(map[string]any{
		"mirrors": map[string]any{
			"docker.io":        map[string]any{"endpoint": []any{"http://10.0.2.2:5000/", "https://mirror.example"}, "rewrite": map[string]any{"^(.*)$": "lib/$1"}},
			"registry.example": map[string]any{"endpoint": []any{"https://r.example:8443"}},
			"*":                map[string]any{"endpoint": []any{"http://10.0.2.2:5000"}},
		},
		"configs": map[string]any{"r.example:8443": map[string]any{"tls": map[string]any{"ca_file": "/etc/ca.crt", "insecure_skip_verify": true}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"docker.io":        {`server = "https://registry-1.docker.io"`, `[host."http://10.0.2.2:5000"]`, `[host."https://mirror.example"]`},
		"registry.example": {`server = "https://registry.example"`, `[host."https://r.example:8443"]`, `skip_verify = true`, `ca = ["/etc/ca.crt"]`},
		"_default":         {`[host."http://10.0.2.2:5000"]`},
	}
	if len(hosts) != len(want) {
		t.Errorf("hosts.toml for %d registries, want %d", len(hosts), len(want))
	}
	for dir, lines := range want {
		last := -1
		for _, l := range lines {
			i := strings.Index(string(hosts[dir]), l)
			if i < last {
				t.Errorf("%s/hosts.toml lacks %q after what came before:\n%s", dir, l, hosts[dir])
			}
			last = i
		}
	}
	if len(ignored) != 1 || ignored[0] != "docker.io" {
		t.Errorf("mirrors whose rewrites were left out: %v, want [docker.io]", ignored)
	}
	if strings.Contains(string(hosts["_default"]), "server =") {
		t.Errorf("_default names a server:\n%s", hosts["_default"])
	}
	for _, bad := range []map[string]any{
		{"mirrors": map[string]any{"docker.io": map[string]any{"endpoint": []any{"10.0.2.2:5000"}}}},
		{"mirrors": map[string]any{"../x": map[string]any{"endpoint": []any{"http://m"}}}},
	} {
		if _, _, err := RegistryHosts(bad); err == nil {
			t.Errorf("RegistryHosts(%v) accepted", bad)
		}
	}
}

// TestContainerdPullsThroughAMirror: containerd, given the hosts.toml the node renders from a
// registries file, pulls an image named for a registry that does not exist
// (registry.liken.test) from its mirror, a real registry on this host, through the CRI as the
// kubelet asks it.
func TestContainerdPullsThroughAMirror(t *testing.T) {
	n, conn, log := startContainerd(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.New(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	mirror := "http://" + l.Addr().String()

	// The image, pushed to the mirror under the name the pod uses.
	dir := t.TempDir()
	pause := filepath.Join(dir, "pause")
	buildStatic(t, pause, "liken.dev/liken/cmd/liken-pause")
	prog, _ := os.ReadFile(pause)
	img, err := image.Build(image.Spec{Entrypoint: []string{"/pause"}, Files: []image.File{{Path: "/pause", Mode: 0o755, Data: prog}},
		Epoch: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(l.Addr().String()+"/demo/pause:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing to the mirror: %v", err)
	}

	hosts, _, err := RegistryHosts(map[string]any{"mirrors": map[string]any{"registry.liken.test": map[string]any{"endpoint": []any{mirror}}}})
	if err != nil {
		t.Fatal(err)
	}
	for d, b := range hosts {
		p := n.agent("etc", "containerd", "certs.d", d, "hosts.toml")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	images := runtimeapi.NewImageServiceClient(conn)
	pulled, err := images.PullImage(t.Context(), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "registry.liken.test/demo/pause:1"}})
	if err != nil {
		t.Fatalf("pulling registry.liken.test/demo/pause:1 through its mirror %s: %v; containerd's log:\n%s", mirror, err, log())
	}
	want, _ := img.Digest()
	st, err := images.ImageStatus(t.Context(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: pulled.ImageRef}})
	if err != nil || st.Image == nil {
		t.Fatalf("the pulled image: %v %v", st, err)
	}
	found := false
	for _, d := range st.Image.RepoDigests {
		found = found || strings.HasSuffix(d, "@"+want.String())
	}
	if !found {
		t.Errorf("pulled %v, want the pushed image %s", st.Image.RepoDigests, want)
	}
}
