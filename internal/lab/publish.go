package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/release"
)

// Publish builds release version from the lab's source tree into its channel and pins it in
// the Cluster's spec.releases, leaving spec.version alone: the upgrade is the operator's
// (`liken upgrade VERSION`). It returns the release's digest.
func Publish(ctx context.Context, dir, version string, out io.Writer) (string, error) {
	st, err := Read(dir)
	if err != nil {
		return "", fmt.Errorf("no lab in %s: %w", dir, err)
	}
	if !apirelease.ValidVersion(version) {
		return "", fmt.Errorf("--version %q is not of the form 2026.07.20-001", version)
	}
	if !st.Alive(st.ChannelPID) {
		return "", fmt.Errorf("the lab in %s is not running (no channel server): `liken lab up` first", dir)
	}
	relDir := filepath.Join(st.Dir, "release", version)
	if _, err := os.Stat(relDir); err == nil {
		return "", fmt.Errorf("the lab already has release %s: give another --version", version)
	}
	cfg, err := st.restConfig(20 * time.Second)
	if err != nil {
		return "", err
	}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return "", err
	}
	if _, err := lc.Cluster(ctx); err != nil {
		return "", fmt.Errorf("reading the lab's Cluster: %w", err)
	}
	fmt.Fprintf(out, "building the stand-in release %s from %s\n", version, st.Source)
	cache, _ := os.UserCacheDir()
	if _, _, err := release.DefaultCache().Build(release.BuildOptions{Version: version, Source: st.Source, StandIn: true, Out: relDir,
		KernelCache: filepath.Join(cache, "liken", "kernel"), Epoch: time.Unix(1785000000, 0), Log: out}); err != nil {
		os.RemoveAll(relDir)
		return "", fmt.Errorf("building the release: %w", err)
	}
	pin, err := release.Publish(filepath.Join(st.Dir, "channel"), relDir)
	if err != nil {
		return "", err
	}
	// The server's API may be slow to answer while the machines catch up on a build that
	// kept the host's cores busy: the pin is written again from a fresh read.
	err = kube.Retry(ctx, 2*time.Minute, func(ctx context.Context) error {
		c, err := lc.Cluster(ctx)
		if err != nil {
			return err
		}
		if c.Spec.Releases == nil {
			c.Spec.Releases = map[string]v1alpha1.Digest{}
		}
		c.Spec.Releases[version] = v1alpha1.Digest(pin)
		_, err = lc.UpdateCluster(ctx, c)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pinning %s in the Cluster: %w", version, err)
	}
	fmt.Fprintf(out, "published %s into the lab's channel and pinned it in the Cluster (%s)\n", version, pin)
	return pin, nil
}
