// Package release is the release document (release.json) and the channel index: the schema
// shared by the release builder, the channel tools, the agent and install. A release is
// pinned by its digest: "sha256:" and the hex SHA-256 of the exact bytes of release.json, so
// every byte a machine runs is checked against the pin in the Cluster.
package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Schema is the release document's schema identifier.
const Schema = "liken.dev/release/v1"

// DocumentName is the document's file name inside a release directory.
const DocumentName = "release.json"

// MaxDocumentSize bounds release.json: it is read before it can be checked.
const MaxDocumentSize = 1 << 20

// Document describes one release.
type Document struct {
	Schema string `json:"schema"`
	// Version is the release's version, e.g. 2026.07.20-001 (date and sequence; sorts in
	// release order as a string).
	Version string `json:"version"`
	// Created is when the release was built (from SOURCE_DATE_EPOCH, so rebuilding gives
	// the same document).
	Created    time.Time  `json:"created"`
	Components Components `json:"components"`
	// Test marks a release built for tests: its init honours liken.test.* kernel
	// arguments, which inject faults (kernel panics, hangs, a k3s that never gets ready).
	// Never for a fleet: 'liken release pin' and 'liken upgrade --pin' refuse it unless
	// asked with --allow-test-release.
	Test bool `json:"test,omitempty"`
	// Files are every file of the release, in name order.
	Files []File `json:"files"`
}

// Components are the versions inside a release.
type Components struct {
	Kernel Kernel `json:"kernel"`
	K3s    K3s    `json:"k3s"`
	Liken  Liken  `json:"liken"`
	// Images are the container images the root image carries for its nodes to import at
	// start, as k3s imports air-gap images (a stand-in release's pause and CoreDNS images).
	Images []Image `json:"images,omitempty"`
}

// Image is a container image in a release's root image.
type Image struct {
	// Name is what it is imported as, e.g. docker.io/rancher/mirrored-pause:3.6.
	Name string `json:"name"`
	// Digest is its manifest's, as containerd and the kubelet report it.
	Digest string `json:"digest"`
	// Archive is its archive's path in the root image.
	Archive string `json:"archive"`
}

// Kernel is the Debian kernel package a release's kernel and modules come from.
type Kernel struct {
	Version string `json:"version"`
	// Package is the .deb's file name and PackageSHA256 its hex SHA-256: Debian keeps only
	// the newest kernel package, so the release records exactly which one it used.
	Package       string `json:"package"`
	PackageSHA256 string `json:"packageSHA256"`
}

// K3s is the k3s binary in the release.
type K3s struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256"`
	// StandIn is true when the release carries liken's k3s stand-in instead of k3s: such a
	// release is for tests only, and machines report it in status.
	StandIn bool `json:"standIn"`
}

// Liken is liken's own version.
type Liken struct {
	Version string `json:"version"`
}

// Role says what a file is for.
type Role string

const (
	RoleKernel     Role = "kernel"
	RoleInitramfs  Role = "initramfs"
	RoleRootfs     Role = "rootfs"
	RoleBootloader Role = "bootloader"
	// RoleSlot is a slot image: a FAT filesystem holding everything one release boots
	// (vmlinuz, initramfs.img, rootfs.squashfs), written whole onto a slot partition.
	RoleSlot  Role = "slot"
	RoleOther Role = "other"
)

// File is one file of a release.
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Role   Role   `json:"role"`
}

var (
	versionRE = regexp.MustCompile(`^[0-9]{4}\.[0-9]{2}\.[0-9]{2}-[0-9]{3}$`)
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	hexRE     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
)

// ValidVersion reports whether v is a release version such as 2026.07.20-001.
func ValidVersion(v string) bool { return versionRE.MatchString(v) }

// ValidDigest reports whether d is "sha256:" and 64 lowercase hex digits.
func ValidDigest(d string) bool { return digestRE.MatchString(d) }

// Digest returns the digest of a release document's exact bytes.
func Digest(doc []byte) string {
	sum := sha256.Sum256(doc)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Parse checks doc against pin first, then decodes and validates it. Nothing in an unpinned
// or mismatching document is ever read.
func Parse(doc []byte, pin string) (*Document, error) {
	if !ValidDigest(pin) {
		return nil, fmt.Errorf("release pin %+q is not a digest ('sha256:' and 64 hex digits): a release is used only when pinned", pin)
	}
	if got := Digest(doc); got != pin {
		return nil, &MismatchError{File: DocumentName, Expected: pin, Actual: got}
	}
	return Decode(doc)
}

// Decode decodes and validates a document without a pin (for the tools that make pins).
func Decode(doc []byte) (*Document, error) {
	if len(doc) > MaxDocumentSize {
		return nil, fmt.Errorf("release document is %d bytes, more than the %d allowed", len(doc), MaxDocumentSize)
	}
	// Fields this liken does not know are ignored, not refused: a machine reads the
	// document of the release it upgrades to, which a newer liken wrote, and the pin
	// already proves it is the publisher's. A change an older liken must not take changes
	// the schema instead.
	dec := json.NewDecoder(bytes.NewReader(doc))
	d := &Document{}
	if err := dec.Decode(d); err != nil {
		return nil, fmt.Errorf("release document is malformed: %w", err)
	}
	if dec.More() {
		return nil, errors.New("release document is malformed: data after the JSON object")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// Validate checks a document's fields.
func (d *Document) Validate() error {
	if d.Schema != Schema {
		return fmt.Errorf("release document has schema %+q; this liken reads %+q", d.Schema, Schema)
	}
	if !ValidVersion(d.Version) {
		return fmt.Errorf("release version %+q is not of the form 2026.07.20-001", d.Version)
	}
	if len(d.Files) == 0 {
		return errors.New("release document lists no files")
	}
	for i, im := range d.Components.Images {
		if im.Name == "" || !ValidDigest(im.Digest) || !strings.HasPrefix(im.Archive, "/") {
			return fmt.Errorf("release image %d: want a name, a digest ('sha256:' and 64 hex digits) and an absolute archive path, got %+q %+q %+q", i, im.Name, im.Digest, im.Archive)
		}
	}
	seen := map[string]bool{}
	for i, f := range d.Files {
		switch {
		case !nameRE.MatchString(f.Name) || f.Name == DocumentName:
			return fmt.Errorf("release file %d: name %+q is not a plain file name (letters, digits, '.', '_', '-'; no '/', no '..')", i, f.Name)
		case seen[f.Name]:
			return fmt.Errorf("release file %+q is listed twice", f.Name)
		case f.Size < 0:
			return fmt.Errorf("release file %+q: negative size %d", f.Name, f.Size)
		case !hexRE.MatchString(f.SHA256):
			return fmt.Errorf("release file %+q: sha256 %+q is not 64 lowercase hex digits", f.Name, f.SHA256)
		}
		switch f.Role {
		case RoleKernel, RoleInitramfs, RoleRootfs, RoleBootloader, RoleSlot, RoleOther:
		default:
			return fmt.Errorf("release file %+q: unknown role %+q", f.Name, f.Role)
		}
		seen[f.Name] = true
	}
	return nil
}

// Marshal encodes a document canonically: indented, files in name order, a final newline.
func (d *Document) Marshal() ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// File returns the file with a role, or nil.
func (d *Document) File(role Role) *File {
	for i := range d.Files {
		if d.Files[i].Role == role {
			return &d.Files[i]
		}
	}
	return nil
}

// MismatchError says which file did not match and how.
type MismatchError struct {
	File             string
	Expected, Actual string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s does not match its pin: expected %s, got %s", e.File, e.Expected, e.Actual)
}

// Index is a channel's index.json: the releases a channel offers.
type Index struct {
	Schema   string       `json:"schema"`
	Releases []IndexEntry `json:"releases"`
}

// IndexSchema identifies the channel index schema.
const IndexSchema = "liken.dev/channel/v1"

// IndexName is the index's file name at a channel's root.
const IndexName = "index.json"

// IndexEntry is one release in a channel.
type IndexEntry struct {
	Version string    `json:"version"`
	Digest  string    `json:"digest"`
	Created time.Time `json:"created"`
}

// StandInControlPlaneDir is where a release built with the k3s stand-in carries the upstream
// programs the stand-in runs: etcd and kube-parts (kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet, kube-proxy, containerd and ctr as links to one program) for a
// server's control plane, and with them, for every machine's node, containerd's runc shim,
// runc and the CNI plugins (cni/). A release with real k3s has none: k3s runs its own.
const StandInControlPlaneDir = "/usr/lib/liken/stand-in/bin"

// StandInXtablesDir holds a stand-in release's iptables (xtables-nft-multi, its loader ld.so,
// lib/ and extensions ext/), which the stand-in's own xtables-nft-multi runs.
const StandInXtablesDir = "/usr/lib/liken/stand-in/xtables"

// StandInImagesDir holds the image archives a stand-in release carries (the pause image),
// which a stand-in node imports at start beside agent/images, as k3s imports air-gap images.
const StandInImagesDir = "/usr/lib/liken/stand-in/images"

// StandInPauseArchive is the pause image's archive in StandInImagesDir, which a node imports
// before its kubelet starts (the release's other images are imported after).
const StandInPauseArchive = "pause.tar"

// StandInCoreDNSImage is the cluster DNS image a stand-in release carries (coredns.tar in
// StandInImagesDir): upstream CoreDNS with the plugins k3s's Corefile uses, under a name of
// its own (k3s's is rancher/mirrored-coredns-coredns, with every plugin).
const StandInCoreDNSImage = "docker.io/liken/stand-in-coredns:1.15.0"

// StandInCoreDNSArchive is that image's archive in StandInImagesDir: a server deploys CoreDNS
// when its release carries it.
const StandInCoreDNSArchive = "coredns.tar"

// The files a stand-in node with real components reads beside its node kubeconfig, which
// init writes from the layer (k3s's agent gets the same from its server's supervisor).
const (
	StandInKubeProxyKubeconfig  = "kube-proxy.kubeconfig"     // user system:kube-proxy
	StandInControllerKubeconfig = "k3s-controller.kubeconfig" // user system:k3s-controller (flannel)
	StandInClientCA             = "client-ca.crt"             // the kubelet's x509 clientCAFile
)

// BuildTimeFile is where the root image records when the release was built (RFC 3339): no
// clock that reads earlier can be right, and k3s must not start by it.
const BuildTimeFile = "/etc/liken/build-time"

// ReadBuildTime reads BuildTimeFile under root ("/" on a machine); a zero time when there is
// none (an image from before it).
func ReadBuildTime(root string) (time.Time, error) {
	b, err := os.ReadFile(filepath.Join(root, BuildTimeFile))
	if errors.Is(err, os.ErrNotExist) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	if err != nil {
		return time.Time{}, fmt.Errorf("reading %s: %w", BuildTimeFile, err)
	}
	return t, nil
}
