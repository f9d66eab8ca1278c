package tuf

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/theupdateframework/go-tuf/v2/metadata"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/atomicfile"
)

// MetadataDir is where a channel keeps its TUF metadata, beside its releases.
const MetadataDir = "metadata"

// Expiry is how long each role's metadata stays valid after it is signed. A client refuses
// expired metadata, which is what keeps a mirror from serving an old channel for ever (a
// freeze): the timestamp, re-signed by `liken release timestamp`, expires first.
type Expiry struct {
	Root, Targets, Snapshot, Timestamp time.Duration
}

// DefaultExpiry: a year for the root (its keys are kept offline), three months for targets,
// a month for the snapshot, a week for the timestamp.
var DefaultExpiry = Expiry{Root: 365 * 24 * time.Hour, Targets: 90 * 24 * time.Hour, Snapshot: 30 * 24 * time.Hour, Timestamp: 7 * 24 * time.Hour}

// Repo is a channel's metadata as its publisher writes it.
type Repo struct {
	// Channel is the channel directory (metadata/ is in it).
	Channel string
	Expiry  Expiry
	// Now is the signing time (time.Now when nil); tests sign in the past.
	Now func() time.Time
}

func (r *Repo) now() time.Time {
	if r.Now != nil {
		return r.Now().UTC()
	}
	return time.Now().UTC()
}

func (r *Repo) dir() string { return filepath.Join(r.Channel, MetadataDir) }

// Signed says whether the channel has TUF metadata.
func Signed(channel string) bool {
	_, err := os.Stat(filepath.Join(channel, MetadataDir, "1.root.json"))
	return err == nil
}

// InitOptions are the keys a new channel gets.
type InitOptions struct {
	// KeyDir receives the new private keys.
	KeyDir string
	// RootKeys and TargetsKeys are how many keys the root and targets roles get, and
	// RootThreshold and TargetsThreshold how many of them must sign (1 each by default).
	RootKeys, RootThreshold, TargetsKeys, TargetsThreshold int
}

// Init makes the channel's keys and its first metadata: root version 1, empty targets, the
// snapshot and the timestamp. It refuses a channel that has metadata already. It returns
// the digest of 1.root.json, which operators trust (Cluster.spec.channelRoot).
func (r *Repo) Init(o InitOptions) (string, error) {
	if Signed(r.Channel) {
		return "", fmt.Errorf("%s has TUF metadata already (%s): rotate its keys instead", r.Channel, filepath.Join(r.dir(), "1.root.json"))
	}
	if o.KeyDir == "" {
		return "", ErrNoKeys
	}
	counts := map[string][2]int{
		metadata.ROOT:      {max(o.RootKeys, o.RootThreshold, 1), max(o.RootThreshold, 1)},
		metadata.TARGETS:   {max(o.TargetsKeys, o.TargetsThreshold, 1), max(o.TargetsThreshold, 1)},
		metadata.SNAPSHOT:  {1, 1},
		metadata.TIMESTAMP: {1, 1},
	}
	now := r.now()
	root := metadata.Root(now.Add(r.Expiry.Root))
	root.Signed.ConsistentSnapshot = true
	keys := &Keys{byID: map[string]ed25519.PrivateKey{}}
	for _, role := range Roles {
		for range counts[role][0] {
			if _, err := addNewKey(root, keys, o.KeyDir, role); err != nil {
				return "", err
			}
		}
		root.Signed.Roles[role].Threshold = counts[role][1]
	}
	targets := metadata.Targets(now.Add(r.Expiry.Targets))
	if err := os.MkdirAll(r.dir(), 0o755); err != nil {
		return "", err
	}
	rootBytes, err := r.writeRoot(root, keys, nil)
	if err != nil {
		return "", err
	}
	if err := r.writeTargets(root, targets, keys); err != nil {
		return "", err
	}
	sum := sha256.Sum256(rootBytes)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// addNewKey makes a key for role in dir, holds it in keys, and has root trust it for role.
func addNewKey(root *metadata.Metadata[metadata.RootType], keys *Keys, dir, role string) (string, error) {
	id, priv, err := NewKey(dir, role)
	if err != nil {
		return "", err
	}
	keys.byID[id] = priv
	pub, err := publicKey(priv)
	if err != nil {
		return "", err
	}
	return id, root.Signed.AddKey(pub, role)
}

// state is the channel's current metadata.
type state struct {
	root      *metadata.Metadata[metadata.RootType]
	targets   *metadata.Metadata[metadata.TargetsType]
	snapshot  *metadata.Metadata[metadata.SnapshotType]
	timestamp *metadata.Metadata[metadata.TimestampType]
}

func (r *Repo) load() (*state, error) {
	if !Signed(r.Channel) {
		return nil, fmt.Errorf("%s has no TUF metadata: make its keys first (liken release keys init)", r.Channel)
	}
	var s state
	var err error
	if s.root, err = metadata.Root().FromFile(filepath.Join(r.dir(), "root.json")); err != nil {
		return nil, fmt.Errorf("reading the channel's root: %w", err)
	}
	if s.timestamp, err = metadata.Timestamp().FromFile(filepath.Join(r.dir(), "timestamp.json")); err != nil {
		return nil, fmt.Errorf("reading the channel's timestamp: %w", err)
	}
	sv := s.timestamp.Signed.Meta["snapshot.json"]
	if sv == nil {
		return nil, errors.New("the channel's timestamp names no snapshot")
	}
	if s.snapshot, err = metadata.Snapshot().FromFile(filepath.Join(r.dir(), strconv.FormatInt(sv.Version, 10)+".snapshot.json")); err != nil {
		return nil, fmt.Errorf("reading the channel's snapshot: %w", err)
	}
	tv := s.snapshot.Signed.Meta["targets.json"]
	if tv == nil {
		return nil, errors.New("the channel's snapshot names no targets")
	}
	if s.targets, err = metadata.Targets().FromFile(filepath.Join(r.dir(), strconv.FormatInt(tv.Version, 10)+".targets.json")); err != nil {
		return nil, fmt.Errorf("reading the channel's targets: %w", err)
	}
	return &s, nil
}

// sign clears m's signatures and signs it with role's keys from keys, as root says.
func sign[T metadata.Roles](m *metadata.Metadata[T], root *metadata.Metadata[metadata.RootType], role string, keys *Keys) error {
	signers, err := keys.signers(role, root.Signed.Roles[role])
	if err != nil {
		return err
	}
	m.ClearSignatures()
	for _, s := range signers {
		if _, err := m.Sign(s); err != nil {
			return fmt.Errorf("signing %s: %w", role, err)
		}
	}
	return nil
}

// writeRoot signs root with its own keys (and, for a new version, with those of the root
// before it, prev, as TUF requires of a rotation) and writes N.root.json and root.json.
func (r *Repo) writeRoot(root *metadata.Metadata[metadata.RootType], keys *Keys, prev *metadata.Metadata[metadata.RootType]) ([]byte, error) {
	root.ClearSignatures()
	signed := map[string]bool{}
	for _, by := range []*metadata.Metadata[metadata.RootType]{prev, root} {
		if by == nil {
			continue
		}
		signers, err := keys.signers(metadata.ROOT, by.Signed.Roles[metadata.ROOT])
		if err != nil {
			if by == prev {
				return nil, fmt.Errorf("root version %d must be signed by the keys of version %d: %w", root.Signed.Version, prev.Signed.Version, err)
			}
			return nil, err
		}
		for _, s := range signers {
			pub, err := s.PublicKey()
			if err != nil {
				return nil, err
			}
			k, err := metadata.KeyFromPublicKey(pub)
			if err != nil {
				return nil, err
			}
			id, err := k.ID()
			if err != nil {
				return nil, err
			}
			if signed[id] {
				continue
			}
			signed[id] = true
			if _, err := root.Sign(s); err != nil {
				return nil, fmt.Errorf("signing root: %w", err)
			}
		}
	}
	b, err := root.ToBytes(true)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(r.dir(), fmt.Sprintf("%d.root.json", root.Signed.Version)), b, 0o644); err != nil {
		return nil, err
	}
	return b, atomicfile.Write(filepath.Join(r.dir(), "root.json"), b, 0o644)
}

// writeTargets signs and writes targets, then a new snapshot naming it and a new timestamp
// naming that: N.targets.json, N.snapshot.json, timestamp.json last.
func (r *Repo) writeTargets(root *metadata.Metadata[metadata.RootType], targets *metadata.Metadata[metadata.TargetsType], keys *Keys) error {
	if err := signAndWrite(r, targets, root, metadata.TARGETS, fmt.Sprintf("%d.targets.json", targets.Signed.Version), keys); err != nil {
		return err
	}
	snapshot := metadata.Snapshot(r.now().Add(r.Expiry.Snapshot))
	if old, err := r.load(); err == nil {
		snapshot.Signed.Version = old.snapshot.Signed.Version + 1
	}
	snapshot.Signed.Meta["targets.json"] = metadata.MetaFile(targets.Signed.Version)
	return r.writeSnapshot(root, snapshot, keys)
}

func (r *Repo) writeSnapshot(root *metadata.Metadata[metadata.RootType], snapshot *metadata.Metadata[metadata.SnapshotType], keys *Keys) error {
	if err := signAndWrite(r, snapshot, root, metadata.SNAPSHOT, fmt.Sprintf("%d.snapshot.json", snapshot.Signed.Version), keys); err != nil {
		return err
	}
	timestamp := metadata.Timestamp(r.now().Add(r.Expiry.Timestamp))
	if old, err := metadata.Timestamp().FromFile(filepath.Join(r.dir(), "timestamp.json")); err == nil {
		timestamp.Signed.Version = old.Signed.Version + 1
	}
	timestamp.Signed.Meta["snapshot.json"] = metadata.MetaFile(snapshot.Signed.Version)
	return r.writeTimestamp(root, timestamp, keys)
}

func (r *Repo) writeTimestamp(root *metadata.Metadata[metadata.RootType], timestamp *metadata.Metadata[metadata.TimestampType], keys *Keys) error {
	return signAndWrite(r, timestamp, root, metadata.TIMESTAMP, "timestamp.json", keys)
}

// signAndWrite signs m with role's keys, as root says, and writes it into the metadata
// directory as name (atomically: a reader sees the old file or the new one).
func signAndWrite[T metadata.Roles](r *Repo, m *metadata.Metadata[T], root *metadata.Metadata[metadata.RootType], role, name string, keys *Keys) error {
	if err := sign(m, root, role, keys); err != nil {
		return err
	}
	b, err := m.ToBytes(true)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(r.dir(), name), b, 0o644)
}

// Target is a file to sign as a target: its path in the channel, size and SHA-256 (hex).
type Target struct {
	Path   string
	Size   int64
	SHA256 string
}

// AddTargets signs targets into the channel (a new targets version, then snapshot and
// timestamp). A path already signed with other contents is refused: a published file never
// changes.
func (r *Repo) AddTargets(keys *Keys, add []Target) error {
	s, err := r.load()
	if err != nil {
		return err
	}
	t := s.targets
	added := 0
	for _, a := range add {
		sum, err := hex.DecodeString(a.SHA256)
		if err != nil || len(sum) != sha256.Size {
			return fmt.Errorf("target %s: %q is not a SHA-256", a.Path, a.SHA256)
		}
		if old := t.Signed.Targets[a.Path]; old != nil {
			if old.Length != a.Size || hex.EncodeToString(old.Hashes["sha256"]) != a.SHA256 {
				return fmt.Errorf("target %s is signed already with other contents: a published file never changes", a.Path)
			}
			continue
		}
		t.Signed.Targets[a.Path] = &metadata.TargetFiles{Length: a.Size, Hashes: metadata.Hashes{"sha256": sum}, Path: a.Path}
		added++
	}
	if added == 0 {
		return nil // all signed already, as they are: nothing to sign again
	}
	t.Signed.Version++
	t.Signed.Expires = r.now().Add(r.Expiry.Targets)
	return r.writeTargets(s.root, t, keys)
}

// CanSign says whether keys hold enough keys to sign each of roles, before anything is
// written: a publish checks it before it copies a release into the channel.
func (r *Repo) CanSign(keys *Keys, roles ...string) error {
	s, err := r.load()
	if err != nil {
		return err
	}
	for _, role := range roles {
		if _, err := keys.signers(role, s.root.Signed.Roles[role]); err != nil {
			return err
		}
	}
	return nil
}

// Timestamp signs a new timestamp (and a new snapshot first, when the current one would
// expire before the new timestamp does): what a publisher runs more often than the
// timestamp's expiry, so clients can tell a current channel from a frozen one.
func (r *Repo) Timestamp(keys *Keys) error {
	s, err := r.load()
	if err != nil {
		return err
	}
	if s.snapshot.Signed.Expires.Before(r.now().Add(r.Expiry.Timestamp)) {
		s.snapshot.Signed.Version++
		s.snapshot.Signed.Expires = r.now().Add(r.Expiry.Snapshot)
		return r.writeSnapshot(s.root, s.snapshot, keys)
	}
	s.timestamp.Signed.Version++
	s.timestamp.Signed.Expires = r.now().Add(r.Expiry.Timestamp)
	return r.writeTimestamp(s.root, s.timestamp, keys)
}

// Rotate replaces one key of role with a new one written into newKeyDir: a new root version
// revokes the old key and trusts the new one, signed by the keys of the root before it (and
// by the new root's own, for the root role), and the role's metadata is signed again with
// the new key. old is the key ID to replace (a prefix will do); empty means the role's only
// key. It returns the new key's ID.
func (r *Repo) Rotate(keys *Keys, role, old, newKeyDir string) (string, error) {
	s, err := r.load()
	if err != nil {
		return "", err
	}
	cur := s.root.Signed.Roles[role]
	if cur == nil {
		return "", fmt.Errorf("%q is not a role: one of %v", role, Roles)
	}
	var revoke string
	for _, id := range cur.KeyIDs {
		if old == "" && len(cur.KeyIDs) == 1 || old != "" && len(old) <= len(id) && id[:len(old)] == old {
			if revoke != "" {
				return "", fmt.Errorf("%q names more than one %s key", old, role)
			}
			revoke = id
		}
	}
	if revoke == "" {
		if old == "" {
			return "", fmt.Errorf("the %s role has %d keys: say which to replace", role, len(cur.KeyIDs))
		}
		return "", fmt.Errorf("no %s key has the ID %s", role, old)
	}
	prevBytes, err := s.root.ToBytes(false)
	if err != nil {
		return "", err
	}
	prev, err := metadata.Root().FromBytes(prevBytes)
	if err != nil {
		return "", err
	}
	next := s.root
	id, err := addNewKey(next, keys, newKeyDir, role)
	if err != nil {
		return "", err
	}
	if err := next.Signed.RevokeKey(revoke, role); err != nil {
		return "", err
	}
	next.Signed.Version++
	next.Signed.Expires = r.now().Add(r.Expiry.Root)
	if _, err := r.writeRoot(next, keys, prev); err != nil {
		return "", err
	}
	switch role {
	case metadata.TARGETS:
		s.targets.Signed.Version++
		s.targets.Signed.Expires = r.now().Add(r.Expiry.Targets)
		err = r.writeTargets(next, s.targets, keys)
	case metadata.SNAPSHOT:
		s.snapshot.Signed.Version++
		s.snapshot.Signed.Expires = r.now().Add(r.Expiry.Snapshot)
		err = r.writeSnapshot(next, s.snapshot, keys)
	case metadata.TIMESTAMP:
		s.timestamp.Signed.Version++
		s.timestamp.Signed.Expires = r.now().Add(r.Expiry.Timestamp)
		err = r.writeTimestamp(next, s.timestamp, keys)
	}
	return id, err
}

// SignRelease signs a release laid out in the channel: its release.json (read from
// releaseDir) and every file the document names, as targets under VERSION/.
func (r *Repo) SignRelease(keys *Keys, releaseDir string) error {
	raw, err := os.ReadFile(filepath.Join(releaseDir, apirelease.DocumentName))
	if err != nil {
		return err
	}
	doc, err := apirelease.Decode(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", releaseDir, err)
	}
	sum := sha256.Sum256(raw)
	targets := []Target{{Path: doc.Version + "/" + apirelease.DocumentName, Size: int64(len(raw)), SHA256: hex.EncodeToString(sum[:])}}
	for _, f := range doc.Files {
		targets = append(targets, Target{Path: doc.Version + "/" + f.Name, Size: f.Size, SHA256: f.SHA256})
	}
	return r.AddTargets(keys, targets)
}
