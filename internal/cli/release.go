package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/release"
)

func runRelease(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, `Usage:
  liken release publish --channel DIR RELEASE_DIR
      check a release against its release.json and lay it out in a channel directory
  liken release pin --channel URL --version V [--cluster FILE]
      print a release's digest; with --cluster, also pin it in that Cluster manifest
  liken release verify --channel URL --version V (--pin DIGEST | --cluster FILE)
      download a whole release and check every byte against its pin
  liken release build --version V --out DIR (--k3s PATH --k3s-version V | --k3s-stand-in)
      [--kernel-deb PATH] [--source DIR] [--epoch SECONDS]
      build a release: kernel, initramfs, root image and release.json
A channel URL is http://, https:// or file://.`)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		usage()
		if len(args) == 0 {
			return fmt.Errorf("%w: give a release command", errUsage)
		}
		return nil
	}
	if args[0] == "build" {
		return runReleaseBuild(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("release "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	channel := fs.String("channel", "", "channel directory (publish) or URL")
	version := fs.String("version", "", "release version, such as 2026.07.20-001")
	pin := fs.String("pin", "", "the release's digest")
	clusterFile := fs.String("cluster", "", "a Cluster manifest file")
	if err := fs.Parse(args[1:]); err != nil {
		return errUsage
	}
	if *channel == "" {
		return fmt.Errorf("%w: --channel is required", errUsage)
	}
	f := &release.Fetcher{Progress: progressPrinter(stderr)}
	switch args[0] {
	case "publish":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: give one release directory", errUsage)
		}
		digest, err := release.Publish(*channel, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "published %s\n", digest)
		return nil
	case "pin":
		digest, doc, err := release.Pin(ctx, f, *channel, *version)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s %s\n", doc.Version, digest)
		if doc.Components.K3s.StandIn {
			fmt.Fprintln(stderr, "warning: this release carries liken's k3s stand-in, not k3s: it is for tests only")
		}
		if *clusterFile != "" {
			v, err := manifest.NewValidator()
			if err != nil {
				return err
			}
			if err := manifest.SetReleasePin(v, *clusterFile, doc.Version, digest); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "pinned %s in %s\n", doc.Version, *clusterFile)
		}
		return nil
	case "verify":
		p := *pin
		if p == "" && *clusterFile != "" {
			docs, err := manifest.Load(*clusterFile)
			if err != nil {
				return err
			}
			for _, d := range docs {
				if d.Object.GetKind() == "Cluster" {
					p, _, _ = unstructured.NestedString(d.Object.Object, "spec", "releases", *version)
				}
			}
			if p == "" {
				return fmt.Errorf("%s does not pin release %s", *clusterFile, *version)
			}
		}
		doc, err := release.Verify(ctx, f, *channel, *version, p)
		if err != nil {
			return err
		}
		var total int64
		for _, file := range doc.Files {
			total += file.Size
		}
		fmt.Fprintf(stdout, "verified %s: %d files, %d bytes, every byte matches %s\n", doc.Version, len(doc.Files), total, p)
		return nil
	}
	usage()
	return fmt.Errorf("%w: unknown release command %q", errUsage, args[0])
}

// progressPrinter reports download progress, a line per file every 10%.
func progressPrinter(w io.Writer) func(release.Progress) {
	last := map[string]int64{}
	return func(p release.Progress) {
		if p.Total <= 0 {
			return
		}
		step := p.Done * 10 / p.Total
		if prev, ok := last[p.File]; ok && prev == step {
			return
		}
		last[p.File] = step
		fmt.Fprintf(w, "  %s %3d%% (%d of %d bytes)\n", p.File, step*10, p.Done, p.Total)
	}
}

func runReleaseBuild(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("release build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "release version, such as 2026.07.20-001")
	out := fs.String("out", "", "output directory")
	kernelDeb := fs.String("kernel-deb", "", "linux-image .deb to use (default: the current Debian one, via apt, cached)")
	cache := fs.String("kernel-cache", defaultCache(), "where downloaded kernel packages are kept (outside the clone)")
	k3s := fs.String("k3s", "", "the k3s binary")
	k3sVersion := fs.String("k3s-version", "", "the k3s binary's version, such as v1.36.3+k3s1")
	standIn := fs.Bool("k3s-stand-in", false, "put liken's k3s stand-in in the release instead of k3s (tests only; the release says so)")
	source := fs.String("source", ".", "the liken source tree")
	epoch := fs.Int64("epoch", envEpoch(), "timestamp of every file (default SOURCE_DATE_EPOCH, else 0)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *version == "" || *out == "" {
		return fmt.Errorf("%w: --version and --out are required", errUsage)
	}
	if *k3s != "" && *k3sVersion == "" {
		return fmt.Errorf("%w: --k3s needs --k3s-version", errUsage)
	}
	start := time.Now()
	digest, doc, err := release.Build(release.BuildOptions{
		Version: *version, Source: *source, KernelDeb: *kernelDeb, KernelCache: *cache,
		K3s: *k3s, K3sVersion: *k3sVersion, StandIn: *standIn, Epoch: time.Unix(*epoch, 0), Out: *out, Log: stderr,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "built %s in %s: %s\n", doc.Version, time.Since(start).Round(time.Second), digest)
	if doc.Components.K3s.StandIn {
		fmt.Fprintln(stdout, "note: this release carries liken's k3s stand-in, not k3s: for tests only")
	}
	return nil
}

func defaultCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "liken", "kernel")
	}
	return filepath.Join(os.TempDir(), "liken-kernel-cache")
}

func envEpoch() int64 {
	n, _ := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	return n
}
