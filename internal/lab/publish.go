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
	"liken.dev/liken/internal/tuf"
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
	cfg, err := st.restConfig(20 * time.Second)
	if err != nil {
		return "", err
	}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return "", err
	}
	c, err := lc.Cluster(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the lab's Cluster: %w", err)
	}
	// A release already built here is published again (a no-op for the same document) and
	// pinned: so a publish cut short after its build, by a signal or an API server that did
	// not answer, is finished by running it again, not refused with a release the Cluster
	// does not know.
	built := false
	if _, err := os.Stat(filepath.Join(relDir, apirelease.DocumentName)); err == nil {
		if _, pinned := c.Spec.Releases[version]; pinned {
			return "", fmt.Errorf("the lab already has release %s, pinned in the Cluster: give another --version", version)
		}
		built = true
		fmt.Fprintf(out, "release %s was built before but not pinned: publishing and pinning it\n", version)
	} else if err := os.RemoveAll(relDir); err != nil { // half a build, if any
		return "", err
	}
	if !built {
		fmt.Fprintf(out, "building the stand-in release %s from %s\n", version, st.Source)
		if _, _, err := release.DefaultCache().Build(ReleaseOptions(version, st.Source, relDir, out)); err != nil {
			os.RemoveAll(relDir)
			return "", fmt.Errorf("building the release: %w", err)
		}
	}
	pin, err := publishSigned(st, relDir)
	if err != nil {
		return "", err
	}
	if st.ChannelRoot != "" {
		// Pinned as an operator pins: only what the channel's root, trusted by its digest,
		// says its keys signed.
		if err := tuf.VerifyRelease(ctx, &release.Fetcher{}, "file://"+filepath.Join(st.Dir, "channel"), st.ChannelRoot, version, pin, ""); err != nil {
			return "", fmt.Errorf("release %s: not pinned: %w", version, err)
		}
	}
	// The server's API may not answer for minutes after a build that kept the host's cores
	// and disk busy (its TCG machine starved, its etcd waiting on writes): CI once saw it
	// silent for more than two. The pin is written again from a fresh read until it lands,
	// saying so while it waits.
	since, said := time.Now(), time.Now()
	err = kube.Retry(ctx, pinPatience, func(ctx context.Context) error {
		err := pinIn(ctx, lc, version, pin)
		if err != nil && kube.Passing(err) && time.Since(said) >= 30*time.Second {
			said = time.Now()
			fmt.Fprintf(out, "the lab's API server has not taken the pin for %s (retrying until %s): %v\n",
				time.Since(since).Round(time.Second), pinPatience, err)
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pinning %s in the Cluster (it is in the lab's channel; run the same publish again to pin it): %w", version, err)
	}
	fmt.Fprintf(out, "published %s into the lab's channel and pinned it in the Cluster (%s)\n", version, pin)
	return pin, nil
}

// publishSigned lays the release in relDir out in the lab's channel and, when the channel is
// signed (every lab since issue 31), signs it with the lab's keys. It returns the pin.
func publishSigned(st *State, relDir string) (string, error) {
	channel := filepath.Join(st.Dir, "channel")
	pin, err := release.Publish(channel, relDir)
	if err != nil {
		return "", err
	}
	if !tuf.Signed(channel) {
		return pin, nil
	}
	keys, err := tuf.LoadKeys(filepath.Join(st.Dir, "keys"))
	if err != nil {
		return "", err
	}
	if err := (&tuf.Repo{Channel: channel, Expiry: tuf.DefaultExpiry}).SignRelease(keys, relDir); err != nil {
		return "", fmt.Errorf("signing release %s: %w", filepath.Base(relDir), err)
	}
	return pin, nil
}

// pinPatience bounds how long Publish waits for the lab's API server to take the pin.
const pinPatience = 10 * time.Minute

// pinIn pins version at digest in the Cluster's spec.releases, from a fresh read.
func pinIn(ctx context.Context, lc *kube.Client, version, digest string) error {
	c, err := lc.Cluster(ctx)
	if err != nil {
		return err
	}
	if c.Spec.Releases[version] == v1alpha1.Digest(digest) {
		return nil
	}
	if c.Spec.Releases == nil {
		c.Spec.Releases = map[string]v1alpha1.Digest{}
	}
	c.Spec.Releases[version] = v1alpha1.Digest(digest)
	_, err = lc.UpdateCluster(ctx, c)
	return err
}

// ReleaseOptions are the options of a lab's releases (up's and publish's): the stand-in k3s,
// built from source into out, at a fixed epoch so that the same source and version make the
// same release and the release cache serves it again.
func ReleaseOptions(version, source, out string, log io.Writer) release.BuildOptions {
	cache, _ := os.UserCacheDir()
	return release.BuildOptions{Version: version, Source: source, StandIn: true, Out: out,
		KernelCache: filepath.Join(cache, "liken", "kernel"), Epoch: time.Unix(1785000000, 0), Log: log}
}
