package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

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
  liken release build ...   [not yet available: #5]
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
		return fmt.Errorf("%w: release build arrives with issue #5", errUnavailable)
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
					p, _, _ = unstructuredString(d.Object.Object, "spec", "releases", *version)
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

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	cur := any(obj)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
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
