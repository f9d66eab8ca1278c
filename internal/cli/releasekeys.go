package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/tuf"
)

// The signed channel's commands (issue 31): a channel's keys, made and rotated, its
// timestamp renewed; publish signs and pin verifies with them (release.go).

// keysResult is what the keys commands print with -o.
type keysResult struct {
	Channel string `json:"channel"`
	// RootDigest is the digest of the channel's first root, which operators trust.
	RootDigest string `json:"rootDigest,omitempty"`
	Role       string `json:"role,omitempty"`
	NewKey     string `json:"newKey,omitempty"`
	KeyDir     string `json:"keyDir,omitempty"`
}

func newReleaseKeys() *cobra.Command {
	return group(&cobra.Command{
		Use:   "keys",
		Short: "make and rotate a channel's signing keys (The Update Framework)",
		Long: `A signed channel carries The Update Framework's metadata beside its releases (metadata/):
a root that names the keys of four roles (root, targets, snapshot, timestamp) and how many
of each must sign, the targets (each release's files, with their sizes and SHA-256), and a
snapshot and timestamp that say which metadata is current. Clients trust the digest of the
channel's first root and follow its rotations.`,
	}, newReleaseKeysInit(), newReleaseKeysRotate())
}

// expiryFlags adds a flag for each role's expiry.
func expiryFlags(f *pflag.FlagSet, e *tuf.Expiry, roles ...string) {
	*e = tuf.DefaultExpiry
	for _, role := range roles {
		p := map[string]*time.Duration{"root": &e.Root, "targets": &e.Targets, "snapshot": &e.Snapshot, "timestamp": &e.Timestamp}[role]
		f.DurationVar(p, role+"-expires", *p, "how long the "+role+" metadata signed now stays valid")
	}
}

func newReleaseKeysInit() *cobra.Command {
	var o output
	var channel, keyDir string
	var opts tuf.InitOptions
	var exp tuf.Expiry
	cmd := &cobra.Command{
		Use:   "init --channel DIR --keys DIR",
		Short: "make a channel's keys and its first signed metadata",
		Long: `Makes an Ed25519 key for each role (more for root and targets with --root-keys and
--targets-keys) into --keys, as PEM files only their owner can read, and writes the
channel's first metadata. It prints the digest of metadata/1.root.json: the root operators
trust (liken release pin --trusted-root). Keep the root keys offline, apart from the others:
only key rotations need them. A channel is made once; later keys are rotated.`,
		Example: "  liken release keys init --channel /srv/channel --keys ~/liken-keys",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if channel == "" || keyDir == "" {
				return usageErr("--channel and --keys are required")
			}
			for _, c := range [][2]int{{opts.RootKeys, opts.RootThreshold}, {opts.TargetsKeys, opts.TargetsThreshold}} {
				if c[0] < 1 || c[1] < 1 || c[1] > c[0] {
					return usageErr("a role needs at least one key and a threshold from 1 to its number of keys (got %d keys, threshold %d)", c[0], c[1])
				}
			}
			if err := os.MkdirAll(channel, 0o755); err != nil {
				return err
			}
			opts.KeyDir = keyDir
			repo := &tuf.Repo{Channel: channel, Expiry: exp}
			digest, err := repo.Init(opts)
			if err != nil {
				return err
			}
			r := keysResult{Channel: channel, RootDigest: digest, KeyDir: keyDir}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "signed channel %s: its root is %s\n", channel, digest)
				fmt.Fprintf(w, "keys in %s: keep the root keys (root-*.key) offline, apart from the others\n", keyDir)
				fmt.Fprintf(w, "pin releases from it with: liken release pin --channel URL --version V --trusted-root %s\n", digest)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&channel, "channel", "", "the channel directory")
	f.StringVar(&keyDir, "keys", "", "the directory the new private keys are written into")
	f.IntVar(&opts.RootKeys, "root-keys", 1, "how many root keys to make")
	f.IntVar(&opts.RootThreshold, "root-threshold", 1, "how many root keys must sign a new root")
	f.IntVar(&opts.TargetsKeys, "targets-keys", 1, "how many targets keys to make")
	f.IntVar(&opts.TargetsThreshold, "targets-threshold", 1, "how many targets keys must sign the targets")
	expiryFlags(f, &exp, "root", "targets", "snapshot", "timestamp")
	o.add(cmd)
	return cmd
}

func newReleaseKeysRotate() *cobra.Command {
	var o output
	var channel, role, key, newDir string
	var keyDirs []string
	var exp tuf.Expiry
	cmd := &cobra.Command{
		Use:   "rotate --channel DIR --keys DIR... --role ROLE [--key ID] [--new-keys DIR]",
		Short: "replace one of a role's keys: a new root revokes it and trusts a new one",
		Long: `Writes a new root version that revokes the key (--key, a prefix of its ID; not needed
when the role has one key) and trusts a new key written into --new-keys, signed by the root
keys of the version before it (and of the new one, when the root role rotates), then signs
the role's metadata again with the new key. Clients follow the new root and refuse anything
the revoked key signs from then on: what to do when a key is lost or stolen.`,
		Example: `  liken release keys rotate --channel /srv/channel --keys ~/liken-keys --keys /media/offline-root --role targets`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if channel == "" || len(keyDirs) == 0 || role == "" {
				return usageErr("--channel, --keys and --role are required")
			}
			if newDir == "" {
				newDir = keyDirs[0]
			}
			keys, err := tuf.LoadKeys(keyDirs...)
			if err != nil {
				return err
			}
			repo := &tuf.Repo{Channel: channel, Expiry: exp}
			id, err := repo.Rotate(keys, role, key, newDir)
			if err != nil {
				return err
			}
			r := keysResult{Channel: channel, Role: role, NewKey: id, KeyDir: newDir}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "rotated the %s key of %s: the new key %s is in %s\n", role, channel, id[:16], newDir)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&channel, "channel", "", "the channel directory")
	f.StringSliceVar(&keyDirs, "keys", nil, "a directory holding keys: the root keys, and the role's new key's signers (repeatable)")
	f.StringVar(&role, "role", "", "the role whose key is replaced: root, targets, snapshot or timestamp")
	f.StringVar(&key, "key", "", "the ID (or a prefix) of the key to replace, when the role has several")
	f.StringVar(&newDir, "new-keys", "", "where the new key is written (default: the first --keys)")
	expiryFlags(f, &exp, "root", "targets", "snapshot", "timestamp")
	o.add(cmd)
	return cmd
}

func newReleaseTimestamp() *cobra.Command {
	var o output
	var channel string
	var keyDirs []string
	var exp tuf.Expiry
	cmd := &cobra.Command{
		Use:   "timestamp --channel DIR --keys DIR",
		Short: "sign a signed channel's timestamp again before it expires",
		Long: `Clients refuse a channel whose timestamp has expired: that is how they tell a current
channel from a frozen mirror. Run this more often than --timestamp-expires (a week by
default), from a timer; it needs only the timestamp key (and the snapshot key, when the
snapshot would expire first).`,
		Example: "  liken release timestamp --channel /srv/channel --keys ~/liken-keys",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if channel == "" || len(keyDirs) == 0 {
				return usageErr("--channel and --keys are required")
			}
			keys, err := tuf.LoadKeys(keyDirs...)
			if err != nil {
				return err
			}
			if err := (&tuf.Repo{Channel: channel, Expiry: exp}).Timestamp(keys); err != nil {
				return err
			}
			r := keysResult{Channel: channel, Role: "timestamp"}
			return o.print(cmd.OutOrStdout(), r, func(w io.Writer) {
				fmt.Fprintf(w, "signed the timestamp of %s again: valid for %s\n", channel, exp.Timestamp)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&channel, "channel", "", "the channel directory")
	f.StringSliceVar(&keyDirs, "keys", nil, "a directory holding the timestamp key (repeatable)")
	expiryFlags(f, &exp, "snapshot", "timestamp")
	o.add(cmd)
	return cmd
}

// verifyPin checks that digest is the release document the channel's publisher signed for
// version, keeping what it trusted under the user's cache (so a rollback is refused later).
func verifyPin(ctx context.Context, f *release.Fetcher, channel, version, digest, trustedRoot string) error {
	cache := ""
	if d, err := os.UserCacheDir(); err == nil {
		cache = filepath.Join(d, "liken", "tuf")
	}
	return tuf.VerifyRelease(ctx, f, channel, trustedRoot, version, digest, cache)
}
