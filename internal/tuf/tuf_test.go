package tuf

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/theupdateframework/go-tuf/v2/metadata"

	"liken.dev/liken/internal/release"
)

// channel is a signed channel served by a real HTTP server.
type channel struct {
	t       *testing.T
	dir     string
	keyDir  string
	repo    *Repo
	url     string
	rootSum string
	root    []byte
}

func newChannel(t *testing.T, o InitOptions) *channel {
	t.Helper()
	c := &channel{t: t, dir: t.TempDir(), keyDir: filepath.Join(t.TempDir(), "keys")}
	c.repo = &Repo{Channel: c.dir, Expiry: DefaultExpiry}
	o.KeyDir = c.keyDir
	sum, err := c.repo.Init(o)
	if err != nil {
		t.Fatal(err)
	}
	c.rootSum = sum
	srv := httptest.NewServer(http.FileServer(http.Dir(c.dir)))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	if c.root, err = TrustedRoot(t.Context(), fastFetcher(), c.url, sum); err != nil {
		t.Fatal(err)
	}
	return c
}

func fastFetcher() *release.Fetcher {
	return &release.Fetcher{Retries: 1, Backoff: 10 * time.Millisecond}
}

func (c *channel) keys() *Keys {
	c.t.Helper()
	k, err := LoadKeys(c.keyDir)
	if err != nil {
		c.t.Fatal(err)
	}
	return k
}

// publish writes a release document into the channel and, when sign, signs it as a target.
func (c *channel) publish(version string, sign bool) (string, []byte) {
	c.t.Helper()
	path := version + "/release.json"
	data := []byte(fmt.Sprintf(`{"schema":"liken.dev/release/v1","version":%q}`, version))
	if err := os.MkdirAll(filepath.Join(c.dir, version), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, path), data, 0o644); err != nil {
		c.t.Fatal(err)
	}
	if sign {
		sum := sha256.Sum256(data)
		if err := c.repo.AddTargets(c.keys(), []Target{{Path: path, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}}); err != nil {
			c.t.Fatal(err)
		}
	}
	return path, data
}

func (c *channel) client(cache string) *Client {
	return &Client{Channel: c.url, Root: c.root, CacheDir: cache, Fetcher: fastFetcher()}
}

// forge signs the channel's targets with the given keys only (as an attacker holding them
// would), adding path, and publishes a snapshot and timestamp properly signed over it.
func (c *channel) forge(signWith []ed25519.PrivateKey, path string, data []byte) {
	c.t.Helper()
	s, err := c.repo.load()
	if err != nil {
		c.t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	s.targets.Signed.Targets[path] = &metadata.TargetFiles{Length: int64(len(data)), Hashes: metadata.Hashes{"sha256": sum[:]}, Path: path}
	s.targets.Signed.Version++
	s.targets.ClearSignatures()
	for _, k := range signWith {
		signer, err := signature.LoadSigner(k, crypto.Hash(0))
		if err != nil {
			c.t.Fatal(err)
		}
		if _, err := s.targets.Sign(signer); err != nil {
			c.t.Fatal(err)
		}
	}
	b, err := s.targets.ToBytes(true)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.repo.dir(), fmt.Sprintf("%d.targets.json", s.targets.Signed.Version)), b, 0o644); err != nil {
		c.t.Fatal(err)
	}
	snap := metadata.Snapshot(time.Now().Add(time.Hour))
	snap.Signed.Version = s.snapshot.Signed.Version + 1
	snap.Signed.Meta["targets.json"] = metadata.MetaFile(s.targets.Signed.Version)
	if err := c.repo.writeSnapshot(s.root, snap, c.keys()); err != nil {
		c.t.Fatal(err)
	}
}

// roleKeys are the held private keys the current root names for role.
func (c *channel) roleKeys(role string) []ed25519.PrivateKey {
	c.t.Helper()
	s, err := c.repo.load()
	if err != nil {
		c.t.Fatal(err)
	}
	k := c.keys()
	var out []ed25519.PrivateKey
	for _, id := range s.root.Signed.Roles[role].KeyIDs {
		if p, ok := k.byID[id]; ok {
			out = append(out, p)
		}
	}
	return out
}

func wantCheck(t *testing.T, err error, check Check, words string) {
	t.Helper()
	var ve *VerifyError
	if !errors.As(err, &ve) || ve.Check != check || !strings.Contains(err.Error(), words) {
		t.Fatalf("got %v; want the %s check refusing, saying %q", err, check, words)
	}
	t.Logf("refused as it should be: %v", err)
}

// TestSignedChannel (issue 31): a client that trusts a channel's first root, against a real
// HTTP server, accepts exactly what the channel's keys signed and says which check refused
// anything else.
func TestSignedChannel(t *testing.T) {
	ctx := context.Background()

	t.Run("a good chain verifies", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		path, data := c.publish("2026.07.20-001", true)
		if err := c.client("").Check(ctx, path, data); err != nil {
			t.Fatal(err)
		}
		got, err := c.client("").Target(ctx, path)
		sum := sha256.Sum256(data)
		if err != nil || got.SHA256 != hex.EncodeToString(sum[:]) || got.Size != int64(len(data)) {
			t.Fatalf("target %+v, %v", got, err)
		}
	})

	t.Run("a tampered target", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		path, data := c.publish("2026.07.20-001", true)
		tampered := append([]byte(nil), data...)
		tampered[len(tampered)-3] = 'X'
		wantCheck(t, c.client("").Check(ctx, path, tampered), CheckMismatch, "the channel signed")
	})

	t.Run("a target not in the signed metadata", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		c.publish("2026.07.20-001", true)
		path, data := c.publish("2026.07.21-001", false)
		wantCheck(t, c.client("").Check(ctx, path, data), CheckNoTarget, "is not a target the channel signed")
	})

	t.Run("expired targets", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		// Targets signed two hours ago to last an hour; the timestamp renewed since.
		c.repo.Now = func() time.Time { return time.Now().Add(-2 * time.Hour) }
		c.repo.Expiry.Targets = time.Hour
		path, data := c.publish("2026.07.20-001", true)
		c.repo.Now = nil
		if err := c.repo.Timestamp(c.keys()); err != nil {
			t.Fatal(err)
		}
		wantCheck(t, c.client("").Check(ctx, path, data), CheckExpired, "targets is expired")
	})

	t.Run("a freeze: the timestamp not renewed", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		c.repo.Now = func() time.Time { return time.Now().Add(-8 * 24 * time.Hour) }
		path, data := c.publish("2026.07.20-001", true)
		wantCheck(t, c.client("").Check(ctx, path, data), CheckExpired, "timestamp.json is expired")
		// Renewed, it verifies again.
		c.repo.Now = nil
		if err := c.repo.Timestamp(c.keys()); err != nil {
			t.Fatal(err)
		}
		if err := c.client("").Check(ctx, path, data); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a rollback to older metadata", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		cache := t.TempDir()
		path, data := c.publish("2026.07.20-001", true)
		if err := c.client(cache).Check(ctx, path, data); err != nil {
			t.Fatal(err)
		}
		old, err := os.ReadFile(filepath.Join(c.repo.dir(), "timestamp.json"))
		if err != nil {
			t.Fatal(err)
		}
		c.publish("2026.07.21-001", true)
		if err := c.client(cache).Check(ctx, path, data); err != nil {
			t.Fatal(err)
		}
		// A mirror serves the timestamp from before the second release.
		if err := os.WriteFile(filepath.Join(c.repo.dir(), "timestamp.json"), old, 0o644); err != nil {
			t.Fatal(err)
		}
		wantCheck(t, c.client(cache).Check(ctx, path, data), CheckRollback, "older than metadata trusted before")
	})

	t.Run("signatures below the threshold", func(t *testing.T) {
		c := newChannel(t, InitOptions{TargetsKeys: 2, TargetsThreshold: 2})
		path, data := c.publish("2026.07.20-001", true)
		if err := c.client("").Check(ctx, path, data); err != nil {
			t.Fatalf("signed by both keys: %v", err)
		}
		// The publisher's own tools refuse to sign with one key of two.
		one := c.keys()
		id, err := keyID(c.roleKeys(metadata.TARGETS)[0])
		if err != nil {
			t.Fatal(err)
		}
		delete(one.byID, id)
		err = c.repo.AddTargets(one, []Target{{Path: "x", Size: 1, SHA256: strings.Repeat("0", 64)}})
		var te *ThresholdError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), "signing targets needs 2 of its keys") {
			t.Fatalf("signing targets with one key of two: %v", err)
		}
		// Metadata signed by one of the two keys anyway is refused by the client.
		path2, data2 := "2026.07.21-001/release.json", []byte("forged")
		c.forge(c.roleKeys(metadata.TARGETS)[:1], path2, data2)
		wantCheck(t, c.client("").Check(ctx, path2, data2), CheckSigned, "not enough signatures")
	})

	t.Run("a rotated key followed, the revoked one refused", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		cache := t.TempDir()
		path, data := c.publish("2026.07.20-001", true)
		if err := c.client(cache).Check(ctx, path, data); err != nil {
			t.Fatal(err)
		}
		revoked := c.roleKeys(metadata.TARGETS)
		if _, err := c.repo.Rotate(c.keys(), metadata.TARGETS, "", c.keyDir); err != nil {
			t.Fatal(err)
		}
		// The root itself too: version 3, signed by the root keys of versions 2 and 3.
		if _, err := c.repo.Rotate(c.keys(), metadata.ROOT, "", c.keyDir); err != nil {
			t.Fatal(err)
		}
		path2, data2 := c.publish("2026.07.21-001", true)
		// A client that trusted version 1 (cached) and one that starts from it alike
		// follow the chain to version 3 and accept what the new targets key signed.
		for _, cache := range []string{cache, ""} {
			if err := c.client(cache).Check(ctx, path2, data2); err != nil {
				t.Fatalf("after the rotations (cache %q): %v", cache, err)
			}
		}
		if _, err := os.Stat(filepath.Join(c.repo.dir(), "3.root.json")); err != nil {
			t.Fatal(err)
		}
		// Targets signed with the revoked key are refused.
		path3, data3 := "2026.07.22-001/release.json", []byte("signed with a revoked key")
		c.forge(revoked, path3, data3)
		wantCheck(t, c.client(cache).Check(ctx, path3, data3), CheckSigned, "not enough signatures")
	})

	t.Run("the trusted root, and a channel without metadata", func(t *testing.T) {
		c := newChannel(t, InitOptions{})
		_, err := TrustedRoot(ctx, fastFetcher(), c.url, "sha256:"+strings.Repeat("1", 64))
		wantCheck(t, err, CheckRoot, "not the trusted")
		plain := httptest.NewServer(http.FileServer(http.Dir(t.TempDir())))
		defer plain.Close()
		_, err = TrustedRoot(ctx, fastFetcher(), plain.URL, c.rootSum)
		wantCheck(t, err, CheckUnsigned, "has no TUF metadata")
	})
}

// TestInitRefusesASignedChannel: keys are made once per channel; later ones are rotated.
func TestInitRefusesASignedChannel(t *testing.T) {
	c := newChannel(t, InitOptions{})
	if _, err := c.repo.Init(InitOptions{KeyDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "rotate its keys instead") {
		t.Fatalf("a second init: %v", err)
	}
	for _, f := range []string{"1.root.json", "root.json", "1.targets.json", "1.snapshot.json", "timestamp.json"} {
		if _, err := os.Stat(filepath.Join(c.repo.dir(), f)); err != nil {
			t.Error(err)
		}
	}
	names, _ := filepath.Glob(filepath.Join(c.keyDir, "*"+KeyExt))
	if len(names) != 4 {
		t.Errorf("keys %v; want one for each role", names)
	}
	for _, n := range names {
		if st, err := os.Stat(n); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want mode 0600", n, st.Mode(), err)
		}
	}
}
