// Package tuf keeps a channel's The Update Framework (TUF) metadata: the publisher's keys,
// the signed root, targets, snapshot and timestamp roles beside the releases, and the
// verification a client runs before it trusts a release document (issue 31). The metadata
// and the client's checks are go-tuf's (github.com/theupdateframework/go-tuf/v2); liken adds
// the channel's layout, its key files and messages that say which check failed.
//
// A channel signed this way is a directory any web server serves: the releases as before
// (VERSION/release.json and its files, which are the TUF targets), and metadata/ beside them
// (N.root.json for every root version, N.targets.json and N.snapshot.json, and
// timestamp.json, written last, so a reader never sees half a publish).
package tuf

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/theupdateframework/go-tuf/v2/metadata"

	"liken.dev/liken/internal/atomicfile"
)

// Roles are TUF's four top-level roles, in the order they are made.
var Roles = []string{metadata.ROOT, metadata.TARGETS, metadata.SNAPSHOT, metadata.TIMESTAMP}

// KeyExt is the extension of a private key file: PEM, PKCS #8, Ed25519.
const KeyExt = ".key"

// Keys are private keys a publisher holds, by TUF key ID. Which role a key signs for is the
// root's to say: a key directory may hold any of them (root keys are best kept offline, in
// a directory of their own, given only to the commands that need them).
type Keys struct {
	byID map[string]ed25519.PrivateKey
}

// LoadKeys reads every *.key file in dirs.
func LoadKeys(dirs ...string) (*Keys, error) {
	k := &Keys{byID: map[string]ed25519.PrivateKey{}}
	for _, dir := range dirs {
		names, err := filepath.Glob(filepath.Join(dir, "*"+KeyExt))
		if err != nil {
			return nil, err
		}
		if len(names) == 0 {
			if _, err := os.Stat(dir); err != nil {
				return nil, fmt.Errorf("reading keys: %w", err)
			}
		}
		for _, name := range names {
			priv, err := readKey(name)
			if err != nil {
				return nil, err
			}
			id, err := keyID(priv)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			k.byID[id] = priv
		}
	}
	return k, nil
}

// IDs are the key IDs held, sorted.
func (k *Keys) IDs() []string {
	var out []string
	for id := range k.byID {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func readKey(name string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("reading key: %w", err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: not a PEM private key", name)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: a %T, not an Ed25519 key", name, key)
	}
	return priv, nil
}

// NewKey makes an Ed25519 key for role and writes it into dir (mode 0600, never over an
// existing file), named ROLE-KEYID8.key. It returns the key's TUF ID.
func NewKey(dir, role string) (string, ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", nil, err
	}
	id, err := keyID(priv)
	if err != nil {
		return "", nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	name := filepath.Join(dir, role+"-"+id[:8]+KeyExt)
	if _, err := os.Stat(name); err == nil {
		return "", nil, fmt.Errorf("%s exists already", name)
	}
	if err := atomicfile.Write(name, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", nil, fmt.Errorf("writing key: %w", err)
	}
	return id, priv, nil
}

func publicKey(priv ed25519.PrivateKey) (*metadata.Key, error) {
	return metadata.KeyFromPublicKey(priv.Public())
}

func keyID(priv ed25519.PrivateKey) (string, error) {
	k, err := publicKey(priv)
	if err != nil {
		return "", err
	}
	return k.ID()
}

// signers are the held keys among ids, at least threshold of them, for role.
func (k *Keys) signers(role string, r *metadata.Role) ([]signature.Signer, error) {
	if r == nil {
		return nil, fmt.Errorf("the root names no %s role", role)
	}
	var out []signature.Signer
	for _, id := range r.KeyIDs {
		priv, ok := k.byID[id]
		if !ok {
			continue
		}
		s, err := signature.LoadSigner(priv, crypto.Hash(0))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if len(out) < r.Threshold {
		return nil, &ThresholdError{Role: role, Threshold: r.Threshold, Held: len(out), Want: r.KeyIDs}
	}
	return out, nil
}

// ThresholdError: a role cannot be signed with the keys given.
type ThresholdError struct {
	Role      string
	Threshold int
	Held      int
	Want      []string
}

func (e *ThresholdError) Error() string {
	short := make([]string, len(e.Want))
	for i, id := range e.Want {
		short[i] = id[:min(8, len(id))]
	}
	return fmt.Sprintf("signing %s needs %d of its keys (IDs %s); the keys given hold %d of them", e.Role, e.Threshold, strings.Join(short, ", "), e.Held)
}

// ErrNoKeys: no key directory was given where one is needed.
var ErrNoKeys = errors.New("no keys")
