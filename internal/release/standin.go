package release

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/standin/image"
)

// standInParts are the programs test/tools builds that a stand-in release carries in
// apirelease.StandInControlPlaneDir, and the names linked to kube-parts there.
var (
	standInParts = []string{"etcd", "kube-parts", "containerd-shim-runc-v2", "runc"}
	kubePartsAs  = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "containerd", "ctr"}
)

// StandInXtables is the iptables a stand-in release carries for kube-proxy and flannel (k3s
// bundles a static xtables-nft-multi of its own): Debian's, nft backend, with the
// extensions it loads at run time (ext/) and the libraries they link.
var StandInXtables = []DynamicTool{{"xtables-nft-multi", "/usr/sbin/xtables-nft-multi", "iptables"}}

// xtablesExtensions is where Debian's iptables keeps its extensions.
const xtablesExtensions = "/usr/lib/x86_64-linux-gnu/xtables"

// PauseImageRef is the sandbox image a stand-in node's containerd pins, by k3s's default name
// (pause-image), built from cmd/liken-pause.
const PauseImageRef = "docker.io/rancher/mirrored-pause:3.6"

// StageStandInXtables copies StandInXtables, its extensions and the libraries they link under
// stage, at apirelease.StandInXtablesDir.
func StageStandInXtables(stage string) error {
	ext, err := filepath.Glob(filepath.Join(xtablesExtensions, "*.so"))
	if err != nil || len(ext) == 0 {
		return fmt.Errorf("no iptables extensions in %s (apt package iptables): %v", xtablesExtensions, err)
	}
	if err := stageDynamic(stage, strings.TrimPrefix(apirelease.StandInXtablesDir, "/"), StandInXtables, map[string][]string{"ext": ext}, stager(stage)); err != nil {
		return fmt.Errorf("the stand-in's iptables: %w", err)
	}
	return nil
}

// putStandIn stages what the k3s stand-in runs: the upstream programs test/tools builds
// (statically, from the module proxy), the CNI plugins, Debian's iptables with its libraries,
// and the pause and CoreDNS images as air-gap archives, built reproducibly (the pause image
// from pause, the release's liken-pause) at epoch, which it returns for the release document.
func putStandIn(source, pause string, epoch time.Time, put func(rel, src string, mode os.FileMode) error, stage string, log io.Writer) ([]apirelease.Image, error) {
	script := filepath.Join(source, "test", "tools", "build.sh")
	cmd := exec.Command(script)
	// The first build takes minutes: say so as it goes.
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if log != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&out, log), io.MultiWriter(&out, log)
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("building the stand-in's programs with %s: %w: %s", script, err, out.Bytes())
	}
	tools := filepath.Join(source, "test", "tools", "bin")
	dir := strings.TrimPrefix(apirelease.StandInControlPlaneDir, "/")
	for _, f := range standInParts {
		if err := put(filepath.Join(dir, f), filepath.Join(tools, f), 0o755); err != nil {
			return nil, fmt.Errorf("the stand-in's programs: %w", err)
		}
	}
	for _, l := range kubePartsAs {
		if err := os.Symlink("kube-parts", filepath.Join(stage, dir, l)); err != nil {
			return nil, err
		}
	}
	plugins, err := os.ReadDir(filepath.Join(tools, "cni"))
	if err != nil {
		return nil, fmt.Errorf("the CNI plugins: %w", err)
	}
	for _, p := range plugins {
		if err := put(filepath.Join(dir, "cni", p.Name()), filepath.Join(tools, "cni", p.Name()), 0o755); err != nil {
			return nil, err
		}
	}
	if err := StageStandInXtables(stage); err != nil {
		return nil, err
	}
	prog, err := os.ReadFile(pause)
	if err != nil {
		return nil, err
	}
	// CoreDNS runs as root in its image, binding port 53 with the NET_BIND_SERVICE
	// capability k3s's manifest adds (upstream's image sets a file capability for a non-root
	// user instead).
	coredns, err := os.ReadFile(filepath.Join(tools, "coredns"))
	if err != nil {
		return nil, fmt.Errorf("the CoreDNS image: %w", err)
	}
	var made []apirelease.Image
	for _, im := range []struct {
		archive string
		spec    image.Spec
	}{
		{apirelease.StandInPauseArchive, image.Spec{Ref: PauseImageRef, Entrypoint: []string{"/pause"}, User: "65535:65535",
			Files: []image.File{{Path: "/pause", Mode: 0o755, Data: prog}}, Epoch: epoch}},
		{apirelease.StandInCoreDNSArchive, image.Spec{Ref: apirelease.StandInCoreDNSImage, Entrypoint: []string{"/coredns"},
			Files: []image.File{{Path: "/coredns", Mode: 0o755, Data: coredns}}, Epoch: epoch}},
	} {
		archive := filepath.Join(apirelease.StandInImagesDir, im.archive)
		digest, err := writeImage(filepath.Join(stage, archive), im.spec)
		if err != nil {
			return nil, fmt.Errorf("the image %s: %w", im.spec.Ref, err)
		}
		made = append(made, apirelease.Image{Name: im.spec.Ref, Digest: digest, Archive: archive})
	}
	return made, nil
}

// writeImage writes an image's archive at path and returns its digest.
func writeImage(path string, spec image.Spec) (string, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	digest, err := image.WriteArchive(f, spec)
	if err != nil {
		return "", err
	}
	return digest, f.Close()
}
