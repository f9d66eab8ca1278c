package tuf

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"
	"github.com/theupdateframework/go-tuf/v2/metadata/config"
	"github.com/theupdateframework/go-tuf/v2/metadata/updater"

	"liken.dev/liken/internal/release"
)

// Client checks a channel's targets against a root its operator trusts, with every check of
// TUF's client workflow: each root version signed by its predecessor's keys, no metadata
// expired, none older than what was trusted before, every role signed by its threshold of
// the keys the root names for it, each file its length and hashes.
type Client struct {
	// Channel is the channel's URL (http://, https:// or file://).
	Channel string
	// Root is the root metadata the operator trusts (see TrustedRoot).
	Root []byte
	// CacheDir keeps the newest metadata trusted so far (one directory per channel and
	// root), so that metadata older than it is refused later as a rollback. Empty: nothing
	// is kept, and each check starts again from Root.
	CacheDir string
	// Fetcher fetches the metadata (nil: liken's defaults).
	Fetcher *release.Fetcher
	// Record, when set, is given each metadata file fetched (its name in metadata/ and its
	// bytes), for a copy of the channel (MirrorRelease).
	Record func(name string, b []byte) error
}

// TrustedRoot fetches the channel's first root (metadata/1.root.json) and returns it if its
// digest is digest ("sha256:..."): an operator pins the root by digest, as releases are
// pinned, and the client then follows the root's rotations from it by TUF's rules.
func TrustedRoot(ctx context.Context, f *release.Fetcher, channel, digest string) ([]byte, error) {
	if f == nil {
		f = &release.Fetcher{}
	}
	b, err := f.Raw(ctx, channel, MetadataDir+"/1.root.json", 512<<10)
	if errors.Is(err, release.ErrNotFound) {
		return nil, &VerifyError{Check: CheckUnsigned, Err: fmt.Errorf("the channel %s has no TUF metadata (%w): it is not signed", channel, err)}
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the channel's root: %w", err)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return nil, &VerifyError{Check: CheckRoot, Err: fmt.Errorf("the channel's 1.root.json has digest %s, not the trusted %s: another publisher's channel, or one made again with new keys", got, digest)}
	}
	return b, nil
}

// Check names what a verification refused.
type Check string

const (
	CheckUnsigned Check = "unsigned"   // the channel has no TUF metadata
	CheckRoot     Check = "root"       // the first root is not the trusted one
	CheckExpired  Check = "expired"    // metadata past its expiry (a freeze, or not re-signed)
	CheckRollback Check = "rollback"   // metadata older than metadata trusted before
	CheckSigned   Check = "signatures" // below a role's threshold of the root's keys for it
	CheckMismatch Check = "mismatch"   // a file does not match its signed length and hashes
	CheckNoTarget Check = "target"     // the file is not a target the channel signed
	CheckFetch    Check = "fetch"      // the metadata could not be fetched
)

// VerifyError says which check refused what, and why.
type VerifyError struct {
	Check Check
	Err   error
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("the channel's signed metadata failed the %s check: %v", e.Check, e.Err)
}

func (e *VerifyError) Unwrap() error { return e.Err }

// explain turns go-tuf's errors into a VerifyError that says what the check means.
func explain(err error) error {
	var ve *VerifyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ve):
		return err
	case errors.Is(err, &metadata.ErrExpiredMetadata{}):
		return &VerifyError{Check: CheckExpired, Err: fmt.Errorf("%w: the channel is frozen (a mirror serving old metadata) or its publisher has not re-signed it in time (liken release timestamp renews the timestamp and snapshot, liken release publish the targets)", err)}
	case errors.Is(err, &metadata.ErrBadVersionNumber{}), errors.Is(err, &metadata.ErrEqualVersionNumber{}):
		return &VerifyError{Check: CheckRollback, Err: fmt.Errorf("%w: the channel serves metadata older than metadata trusted before (a rollback)", err)}
	case errors.Is(err, &metadata.ErrUnsignedMetadata{}):
		return &VerifyError{Check: CheckSigned, Err: fmt.Errorf("%w: not signed by enough of the keys the trusted root names (below the role's threshold, or a revoked or unknown key)", err)}
	case errors.Is(err, &metadata.ErrLengthOrHashMismatch{}):
		return &VerifyError{Check: CheckMismatch, Err: fmt.Errorf("%w: a file does not match the signed metadata (tampered with, or corrupt)", err)}
	case errors.Is(err, release.ErrNotFound):
		return &VerifyError{Check: CheckFetch, Err: fmt.Errorf("%w: the channel's metadata is incomplete", err)}
	case errors.Is(err, &metadata.ErrDownload{}):
		return &VerifyError{Check: CheckFetch, Err: err}
	}
	return err
}

// updater starts go-tuf's client for one use: Refresh once, then lookups.
func (c *Client) updater(ctx context.Context) (*updater.Updater, error) {
	base := strings.TrimSuffix(c.Channel, "/")
	root := c.Root
	cfg, err := config.New(base+"/"+MetadataDir+"/", root)
	if err != nil {
		return nil, err
	}
	cfg.RemoteTargetsURL = base + "/"
	// Releases never change, so they stay at their own paths: consistent snapshots version
	// the metadata only.
	cfg.PrefixTargetsWithHash = false
	cfg.Fetcher = fetcher{ctx: ctx, f: c.Fetcher, record: c.Record}
	if c.CacheDir == "" {
		cfg.DisableLocalCache = true
	} else {
		sum := sha256.Sum256(append([]byte(base+"\x00"), c.Root...))
		cfg.LocalMetadataDir = filepath.Join(c.CacheDir, hex.EncodeToString(sum[:8]))
		cfg.LocalTargetsDir = filepath.Join(cfg.LocalMetadataDir, "targets")
		// Start from the newest root trusted before, as TUF's client does: the operator's
		// root is where the chain began, not where it stands.
		if b, err := os.ReadFile(filepath.Join(cfg.LocalMetadataDir, "root.json")); err == nil {
			cfg.LocalTrustedRoot = b
		}
	}
	u, err := updater.New(cfg)
	if err != nil {
		return nil, explain(fmt.Errorf("loading the trusted root: %w", err))
	}
	if err := u.Refresh(); err != nil {
		return nil, explain(err)
	}
	return u, nil
}

// Target is the signed length and SHA-256 of path, after refreshing the channel's metadata.
func (c *Client) Target(ctx context.Context, path string) (Target, error) {
	u, err := c.updater(ctx)
	if err != nil {
		return Target{}, err
	}
	tf, err := u.GetTargetInfo(path)
	if err != nil {
		// go-tuf says so in an untyped error: matched whole, so no other error is taken for it.
		if err.Error() == fmt.Sprintf("target %s not found", path) {
			return Target{}, &VerifyError{Check: CheckNoTarget, Err: fmt.Errorf("%s is not a target the channel signed (published without signing, or not published)", path)}
		}
		return Target{}, explain(err)
	}
	sum := tf.Hashes["sha256"]
	if len(sum) == 0 {
		return Target{}, &VerifyError{Check: CheckMismatch, Err: fmt.Errorf("the signed target %s has no SHA-256", path)}
	}
	return Target{Path: path, Size: tf.Length, SHA256: hex.EncodeToString(sum)}, nil
}

// Check verifies that data is the signed target path.
func (c *Client) Check(ctx context.Context, path string, data []byte) error {
	t, err := c.Target(ctx, path)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != t.Size || hex.EncodeToString(sum[:]) != t.SHA256 {
		return &VerifyError{Check: CheckMismatch, Err: fmt.Errorf("%s is %d bytes with SHA-256 %s; the channel signed %d bytes with %s (tampered with, or corrupt)", path, len(data), hex.EncodeToString(sum[:]), t.Size, t.SHA256)}
	}
	return nil
}

// fetcher is go-tuf's Fetcher over liken's: the same retries, limits and file:// channels.
type fetcher struct {
	ctx    context.Context
	f      *release.Fetcher
	record func(name string, b []byte) error
}

func (t fetcher) DownloadFile(u string, maxLength int64, _ time.Duration) ([]byte, error) {
	f := t.f
	if f == nil {
		f = &release.Fetcher{}
	}
	i := strings.LastIndex(u, "/")
	b, err := f.Raw(t.ctx, u[:i], u[i+1:], maxLength)
	if errors.Is(err, release.ErrNotFound) {
		// What go-tuf reads as "there is no newer root".
		return nil, &metadata.ErrDownloadHTTP{StatusCode: 404, URL: u}
	}
	if err != nil {
		return nil, &metadata.ErrDownload{Msg: err.Error()}
	}
	if t.record != nil {
		if err := t.record(u[i+1:], b); err != nil {
			return nil, &metadata.ErrDownload{Msg: err.Error()}
		}
	}
	return b, nil
}

// MirrorRelease is VerifyRelease that also writes every metadata file it fetched into dir
// (the metadata/ of a copy of the channel): the copy then verifies offline exactly as the
// channel did, as the installer image carries it. Its timestamp expires when the channel's
// does (a week after it was signed, by default): a copy older than that is refused as the
// channel would be, frozen.
func MirrorRelease(ctx context.Context, f *release.Fetcher, channel, rootDigest, version, digest, dir string) error {
	root, err := TrustedRoot(ctx, f, channel, rootDigest)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	record := func(name string, b []byte) error {
		if name != filepath.Base(name) || strings.HasPrefix(name, ".") {
			return fmt.Errorf("metadata file name %q", name)
		}
		return os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if err := record("1.root.json", root); err != nil {
		return err
	}
	c := &Client{Channel: channel, Root: root, Fetcher: f, Record: record}
	return c.verify(ctx, version, digest)
}

// VerifyRelease checks that digest is the release document the channel's publisher signed
// for version, from the root trusted by its digest (rootDigest), keeping what it trusted in
// cacheDir (empty: nothing). It fetches only metadata: a release refused here is never
// downloaded.
func VerifyRelease(ctx context.Context, f *release.Fetcher, channel, rootDigest, version, digest, cacheDir string) error {
	root, err := TrustedRoot(ctx, f, channel, rootDigest)
	if err != nil {
		return err
	}
	c := &Client{Channel: channel, Root: root, CacheDir: cacheDir, Fetcher: f}
	return c.verify(ctx, version, digest)
}

// verify checks that digest is the release document the channel signed for version.
func (c *Client) verify(ctx context.Context, version, digest string) error {
	t, err := c.Target(ctx, version+"/release.json")
	if err != nil {
		return err
	}
	if got := "sha256:" + t.SHA256; got != digest {
		return &VerifyError{Check: CheckMismatch, Err: fmt.Errorf("release %s is pinned to %s, but the channel's publisher signed %s (a release.json replaced, or a wrong pin)", version, digest, got)}
	}
	return nil
}
