package cli

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// releaseResult is what release commands print with -o.
type releaseResult struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
	// Path is where the release is (publish: in the channel; build: the output directory).
	Path    string `json:"path,omitempty"`
	Files   int    `json:"files,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	StandIn bool   `json:"k3sStandIn,omitempty"`
	// Test: built for tests, with the liken.test.* fault switches.
	Test bool `json:"test,omitempty"`
	// Signed: published into, or pinned from, a channel's signed metadata.
	Signed bool `json:"signed,omitempty"`
}

// checkTestRelease refuses a release built for tests unless allowed: its init injects
// faults (panics, hangs) on a kernel argument, which no fleet should ever be one typo from.
func checkTestRelease(w io.Writer, doc *apirelease.Document, allow bool) error {
	if !doc.Test {
		return nil
	}
	if !allow {
		return fmt.Errorf("release %s was built for tests (release.json says test: true): its init injects faults on liken.test.* kernel arguments; it is pinned only with --allow-test-release", doc.Version)
	}
	fmt.Fprintf(w, "warning: release %s was built for tests: its init injects faults on liken.test.* kernel arguments\n", doc.Version)
	return nil
}

func newRelease() *cobra.Command {
	return group(&cobra.Command{
		Use:   "release",
		Short: "build, publish, pin and verify releases",
		Long: `Releases are published in a channel: a directory any web server can serve, read by URL
(http://, https:// or file://). A Cluster pins each release by the digest of its
release.json.`,
	}, newReleaseBuild(), newReleasePublish(), newReleasePin(), newReleaseVerify(), newReleaseKeys(), newReleaseTimestamp())
}

// checkRelease checks what pin and verify both need: an output format, a channel, a version.
func checkRelease(o *output, channel, version string) error {
	if err := o.check(); err != nil {
		return err
	}
	if channel == "" {
		return usageErr("--channel is required")
	}
	return checkVersion(version)
}

func checkVersion(v string) error {
	if v == "" {
		return usageErr("--version is required")
	}
	if !apirelease.ValidVersion(v) {
		return usageErr("--version %q is not a release version such as 2026.07.20-001", v)
	}
	return nil
}

func newReleasePublish() *cobra.Command {
	var o output
	var channel string
	var keyDirs []string
	var exp tuf.Expiry
	cmd := &cobra.Command{
		Use:   "publish --channel DIR [--keys DIR...] RELEASE_DIR",
		Short: "check a release against its release.json, lay it out in a channel directory and sign it",
		Long: `Checks every file of the release against its release.json and lays it out under
DIR/VERSION. In a signed channel (liken release keys init) it then signs the release's
files as targets with --keys (the targets, snapshot and timestamp keys), and refuses to
publish without them. A channel with no signing metadata is published into unsigned, with a
warning: nothing then proves who published its releases.`,
		Example: "  liken release publish --channel /srv/channel --keys ~/liken-keys out/2026.07.20-001",
		Args:    exactArgs(1, "one release directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if channel == "" {
				return usageErr("--channel is required")
			}
			repo := &tuf.Repo{Channel: channel, Expiry: exp}
			signed := tuf.Signed(channel)
			var keys *tuf.Keys
			switch {
			case signed && len(keyDirs) == 0:
				return usageErr("the channel %s is signed (its metadata is in %s): give --keys with its targets, snapshot and timestamp keys", channel, filepath.Join(channel, tuf.MetadataDir))
			case signed:
				var err error
				if keys, err = tuf.LoadKeys(keyDirs...); err != nil {
					return err
				}
				// Before anything is copied: a release the keys cannot sign is not published.
				if err := repo.CanSign(keys, "targets", "snapshot", "timestamp"); err != nil {
					return err
				}
			case len(keyDirs) > 0:
				return fmt.Errorf("the channel %s is not signed: make its keys first (liken release keys init --channel %s --keys DIR)", channel, channel)
			default:
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: the channel %s is not signed: nothing proves who published its releases (liken release keys init)\n", channel)
			}
			digest, err := release.Publish(channel, args[0])
			if err != nil {
				return err
			}
			raw, err := os.ReadFile(filepath.Join(args[0], apirelease.DocumentName))
			if err != nil {
				return err
			}
			doc, err := apirelease.Parse(raw, digest)
			if err != nil {
				return err
			}
			if signed {
				if err := repo.SignRelease(keys, args[0]); err != nil {
					return fmt.Errorf("signing release %s (it is in the channel, not signed yet: publish it again with the keys): %w", doc.Version, err)
				}
			}
			r := releaseResult{Version: doc.Version, Digest: digest, Path: filepath.Join(channel, doc.Version), Signed: signed}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "published %s %s in %s\n", r.Version, r.Digest, r.Path)
				if signed {
					fmt.Fprintf(w, "signed %s's files as targets of the channel\n", r.Version)
				}
			})
		},
	}
	cmd.Flags().StringSliceVar(&keyDirs, "keys", nil, "a directory holding the channel's targets, snapshot and timestamp keys (repeatable)")
	expiryFlags(cmd.Flags(), &exp, "targets", "snapshot", "timestamp")
	cmd.Flags().StringVar(&channel, "channel", "", "the channel directory")
	o.add(cmd)
	return cmd
}

func newReleasePin() *cobra.Command {
	var o output
	var channel, version, clusterFile, trustedRoot string
	var setVersion, allowTest, unsigned bool
	cmd := &cobra.Command{
		Use:   "pin --channel URL --version V (--trusted-root DIGEST | --insecure-unsigned) [--cluster FILE [--set-version]]",
		Short: "print a release's digest; with --cluster, pin it in that Cluster manifest",
		Example: `  liken release pin --channel https://releases.example.com/liken --version 2026.07.20-001 --trusted-root sha256:...
  liken release pin --channel file:///srv/channel --version 2026.07.20-001 --trusted-root sha256:... --cluster cluster.yaml --set-version`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkRelease(&o, channel, version); err != nil {
				return err
			}
			if setVersion && clusterFile == "" {
				return usageErr("--set-version needs --cluster")
			}
			switch {
			case trustedRoot != "" && unsigned:
				return usageErr("give --trusted-root or --insecure-unsigned, not both")
			case trustedRoot == "" && !unsigned:
				return usageErr("give --trusted-root DIGEST, the digest of the channel's signed root (liken release keys init printed it), or --insecure-unsigned to pin what an unsigned channel serves, unverified")
			case trustedRoot != "" && !apirelease.ValidDigest(trustedRoot):
				return usageErr("--trusted-root %q is not a digest: give sha256: followed by 64 lowercase hexadecimal digits", trustedRoot)
			}
			f := fetcher(cmd.ErrOrStderr())
			digest, doc, err := release.Pin(cmd.Context(), f, channel, version)
			if err != nil {
				return err
			}
			if trustedRoot != "" {
				if err := verifyPin(cmd.Context(), f, channel, version, digest, trustedRoot); err != nil {
					return fmt.Errorf("release %s: %w", version, err)
				}
			} else {
				fmt.Fprintf(cmd.ErrOrStderr(), "WARNING: --insecure-unsigned: release %s is pinned as the channel serves it, unverified: nothing proves who published it (docs/upgrade.md, \"Signed channels\")\n", version)
			}
			if doc.Components.K3s.StandIn {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: this release carries liken's k3s stand-in, not k3s: it is for tests only")
			}
			if err := checkTestRelease(cmd.ErrOrStderr(), doc, allowTest); err != nil {
				return err
			}
			if clusterFile != "" {
				v, err := manifest.NewValidator()
				if err != nil {
					return err
				}
				if err := manifest.PinRelease(v, clusterFile, doc.Version, digest, setVersion); err != nil {
					return err
				}
			}
			r := releaseResult{Version: doc.Version, Digest: digest, StandIn: doc.Components.K3s.StandIn, Test: doc.Test, Signed: trustedRoot != ""}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "%s %s\n", r.Version, r.Digest)
				if r.Signed {
					fmt.Fprintf(w, "verified: signed by the channel's publisher (root %s)\n", trustedRoot)
				}
				if clusterFile != "" {
					fmt.Fprintf(w, "pinned %s in %s\n", doc.Version, clusterFile)
				}
				if setVersion {
					fmt.Fprintf(w, "spec.version is %s in %s\n", doc.Version, clusterFile)
				}
			})
		},
	}
	cmd.Flags().StringVar(&channel, "channel", "", "the channel URL (http://, https://, file://)")
	cmd.Flags().StringVar(&version, "version", "", "the release version, such as 2026.07.20-001")
	cmd.Flags().StringVar(&clusterFile, "cluster", "", "a Cluster manifest to pin the release in")
	cmd.Flags().BoolVar(&setVersion, "set-version", false, "also set the Cluster's spec.version to this release")
	cmd.Flags().BoolVar(&allowTest, "allow-test-release", false, "pin a release built for tests (with liken.test.* fault switches)")
	cmd.Flags().StringVar(&trustedRoot, "trusted-root", "", "the digest of the channel's first root (from liken release keys init): pin only what its keys signed")
	cmd.Flags().BoolVar(&unsigned, "insecure-unsigned", false, "pin from a channel without signed metadata, unverified (loudly): nothing proves who published the release")
	o.add(cmd)
	return cmd
}

func newReleaseVerify() *cobra.Command {
	var o output
	var channel, version, pin, clusterFile string
	cmd := &cobra.Command{
		Use:   "verify --channel URL --version V (--pin DIGEST | --cluster FILE)",
		Short: "download a whole release and check every byte against its pin",
		Example: `  liken release verify --channel file:///srv/channel --version 2026.07.20-001 --cluster cluster.yaml
  liken release verify --channel https://releases.example.com/liken --version 2026.07.20-001 --pin sha256:...`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkRelease(&o, channel, version); err != nil {
				return err
			}
			switch {
			case pin == "" && clusterFile == "":
				return usageErr("give --pin or --cluster")
			case pin != "" && clusterFile != "":
				return usageErr("give --pin or --cluster, not both")
			case pin != "" && !apirelease.ValidDigest(pin):
				return usageErr("--pin %q is not a digest: give sha256: followed by 64 lowercase hexadecimal digits", pin)
			}
			p := pin
			if clusterFile != "" {
				docs, err := manifest.Load(clusterFile)
				if err != nil {
					return err
				}
				for _, d := range docs {
					if d.Object.GetKind() == "Cluster" {
						p, _, _ = unstructured.NestedString(d.Object.Object, "spec", "releases", version)
					}
				}
				if p == "" {
					return fmt.Errorf("%s does not pin release %s", clusterFile, version)
				}
				if !apirelease.ValidDigest(p) {
					return fmt.Errorf("%s pins release %s to %q, which is not a digest (sha256: followed by 64 lowercase hexadecimal digits)", clusterFile, version, p)
				}
			}
			f := fetcher(cmd.ErrOrStderr())
			doc, err := release.Verify(cmd.Context(), f, channel, version, p)
			if err != nil {
				return err
			}
			r := releaseResult{Version: doc.Version, Digest: p, Files: len(doc.Files), StandIn: doc.Components.K3s.StandIn}
			for _, file := range doc.Files {
				r.Bytes += file.Size
			}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "verified %s: %d files, %d bytes, every byte matches %s\n", r.Version, r.Files, r.Bytes, r.Digest)
			})
		},
	}
	cmd.Flags().StringVar(&channel, "channel", "", "the channel URL (http://, https://, file://)")
	cmd.Flags().StringVar(&version, "version", "", "the release version, such as 2026.07.20-001")
	cmd.Flags().StringVar(&pin, "pin", "", "the release's digest")
	cmd.Flags().StringVar(&clusterFile, "cluster", "", "a Cluster manifest that pins the release")
	o.add(cmd)
	return cmd
}

// fetcher downloads releases for the CLI, printing progress and each retry with its reason
// on w while it retries.
func fetcher(w io.Writer) *release.Fetcher {
	return &release.Fetcher{Progress: release.PrintProgress(w), Retrying: func(r release.Retry) {
		fmt.Fprintf(w, "  %s: %v; attempt %d of %d in %s\n", r.File, r.Err, r.Attempt, r.Of, r.Wait)
	}}
}

func newReleaseBuild() *cobra.Command {
	var (
		o                                                    output
		version, out, kernelDeb, cache, k3s, k3sVersion, src string
		standIn, force, testSwitches                         bool
		epoch                                                int64
	)
	cmd := &cobra.Command{
		Use:   "build --version V --out DIR (--k3s PATH --k3s-version V | --k3s-stand-in)",
		Short: "build a release: kernel, initramfs, root image, slot image and release.json",
		Long: `Builds a release from this source tree, Debian's kernel and k3s. The same inputs give
the same digest. --k3s-stand-in puts liken's node simulator in place of k3s, for tests
only; the release document, 'release pin' and the Node's labels say so.`,
		Example: `  liken release build --version 2026.07.20-001 --out out/2026.07.20-001 --k3s ./k3s --k3s-version v1.36.3+k3s1
  liken release build --version 2026.07.20-001 --out out/test --k3s-stand-in`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if err := checkVersion(version); err != nil {
				return err
			}
			if out == "" {
				return usageErr("--out is required")
			}
			switch {
			case k3s != "" && k3sVersion == "":
				return usageErr("--k3s needs --k3s-version")
			case k3s == "" && !standIn:
				return usageErr("give --k3s PATH --k3s-version V, or --k3s-stand-in for a test release")
			case k3s != "" && standIn:
				return usageErr("give --k3s or --k3s-stand-in, not both")
			}
			if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 && !force {
				return usageErr("--out %s is not empty; give an empty or new directory, or --force to build over it", out)
			}
			if cache == "" {
				cache = defaultCache()
			}
			if !cmd.Flags().Changed("epoch") {
				epoch = defaultEpoch(src)
			}
			start := time.Now()
			digest, doc, err := release.Build(release.BuildOptions{
				Version: version, Source: src, KernelDeb: kernelDeb, KernelCache: cache,
				K3s: k3s, K3sVersion: k3sVersion, StandIn: standIn, TestSwitches: testSwitches, Epoch: time.Unix(epoch, 0), Out: out, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			r := releaseResult{Version: doc.Version, Digest: digest, Path: out, Files: len(doc.Files), StandIn: doc.Components.K3s.StandIn, Test: doc.Test}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "built %s in %s: %s in %s\n", r.Version, time.Since(start).Round(time.Second), r.Digest, r.Path)
				if r.StandIn {
					fmt.Fprintln(w, "note: this release carries liken's k3s stand-in, not k3s: for tests only")
				}
				if r.Test {
					fmt.Fprintln(w, "note: this release is built for tests: its init injects faults on liken.test.* kernel arguments; pinning it takes --allow-test-release")
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&version, "version", "", "release version, such as 2026.07.20-001")
	f.StringVar(&out, "out", "", "output directory (new or empty)")
	f.BoolVar(&force, "force", false, "build into a directory that is not empty")
	f.StringVar(&kernelDeb, "kernel-deb", "", "linux-image .deb to use (default: the current Debian one, via apt, cached)")
	f.StringVar(&cache, "kernel-cache", "", "where downloaded kernel packages are kept, outside the clone (default: the user's cache directory, liken/kernel)")
	f.StringVar(&k3s, "k3s", "", "the k3s binary")
	f.StringVar(&k3sVersion, "k3s-version", "", "the k3s binary's version, such as v1.36.3+k3s1")
	f.BoolVar(&standIn, "k3s-stand-in", false, "put liken's k3s stand-in in the release instead of k3s (tests only; the release says so)")
	f.BoolVar(&testSwitches, "test-switches", false, "build init with the liken.test.* fault switches the VM tests use (the release says test: true; never for a fleet)")
	f.StringVar(&src, "source", ".", "the liken source tree")
	f.Int64Var(&epoch, "epoch", 0, "timestamp of every file and the release's build time, in seconds since 1970; machines never start k3s with a clock earlier than it (default: SOURCE_DATE_EPOCH, else the source's last commit)")
	o.add(cmd)
	return cmd
}

func defaultCache() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "liken", "kernel")
	}
	return filepath.Join(os.TempDir(), "liken-kernel-cache")
}

// defaultEpoch is SOURCE_DATE_EPOCH, else the time of the source's last commit: the same for
// every build of one commit, and a floor machines check their clock against.
func defaultEpoch(src string) int64 {
	if n, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil && n > 0 {
		return n
	}
	out, err := exec.Command("git", "-C", src, "log", "-1", "--format=%ct").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	return n
}
