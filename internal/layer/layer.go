// Package layer is the deployment layer: the small archive that, with the release image,
// is everything a machine runs. It holds the Cluster and Machine manifests, the cluster's
// identity (k3s's custom CA files and join tokens) and each machine's agent credential.
// Servers' layers carry the CA private keys; agents' layers never do.
//
// A layer is a gzip-compressed tar, packed deterministically (sorted entries, fixed times
// and owners, no compression timestamp), whose first entry, layer.json, lists every other
// file with its size, SHA-256 and mode. Unpack refuses a layer whole, writing nothing,
// unless every entry is a plain file with a safe name that matches the index.
package layer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
)

// Schema identifies the layer index format.
const Schema = "liken.dev/layer/v1"

// IndexName is the first entry of every layer.
const IndexName = "layer.json"

// Index is layer.json.
type Index struct {
	Schema string `json:"schema"`
	// Role is the role of the machines this layer is for: server or agent.
	Role v1alpha1.Role `json:"role"`
	// CAHash identifies the cluster: the hash in its join tokens.
	CAHash string `json:"caHash"`
	// Machines are the machines whose credentials this layer carries.
	Machines []string `json:"machines"`
	// Machine, set by install, binds the layer to the machine it was installed for: init
	// uses it when no Machine's hardware match fits.
	Machine string `json:"machine,omitempty"`
	Files   []File `json:"files"`
}

// File is one entry of a layer.
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Mode   int64  `json:"mode"`
}

// Paths inside a layer.
const (
	ClusterManifest = "manifests/cluster.yaml"
	MachinesDir     = "manifests/machines"
	TLSDir          = "tls"
	TokenFile       = "token"
	AgentTokenFile  = "agent-token"
	CredentialsDir  = "credentials"
	K3sManifestsDir = "k3s-manifests"
	// StandInDir holds node certificates for liken's k3s stand-in (test layers only).
	StandInDir = "stand-in"
	// StandInComponentsDir holds the credentials of the node components liken's k3s
	// stand-in runs (kube-proxy, k3s-controller), the same for every machine (test layers only).
	StandInComponentsDir = "stand-in-components"
	// BootstrapCert and BootstrapKey are the servers' bootstrap credential
	// (authority.BootstrapUser): it may only create the Cluster and Machines when absent.
	BootstrapCert = "bootstrap/bootstrap.crt"
	BootstrapKey  = "bootstrap/bootstrap.key"
)

// Entry is a file to pack: its content and permission bits.
type Entry struct {
	Data []byte
	Mode int64
}

// epoch is every entry's time: layers carry no build time, so equal inputs give equal bytes.
var epoch = time.Unix(0, 0).UTC()

// Pack writes the index and files as a deterministic tar.gz (the index lists the files).
func Pack(idx Index, files map[string]Entry) ([]byte, error) {
	names := SortedKeys(files)
	for _, n := range names {
		e := files[n]
		sum := sha256.Sum256(e.Data)
		idx.Files = append(idx.Files, File{Name: n, Size: int64(len(e.Data)), SHA256: hex.EncodeToString(sum[:]), Mode: e.Mode})
	}
	ib, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	write := func(name string, data []byte, mode int64) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)), Mode: mode, ModTime: epoch, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("packing %s: %w", name, err)
		}
		_, err := tw.Write(data)
		return err
	}
	if err := write(IndexName, append(ib, '\n'), 0o644); err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := write(n, files[n].Data, files[n].Mode); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SortedKeys returns a map's keys in order.
func SortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Narrow returns the layer for one machine, as install writes it to that machine's disk: only
// that machine's credential, and the machine's name bound in the index.
func Narrow(data []byte, machine string) ([]byte, *Index, error) {
	idx, files, err := Read(bytes.NewReader(data), DefaultLimits)
	if err != nil {
		return nil, nil, err
	}
	found := false
	for _, m := range idx.Machines {
		found = found || m == machine
	}
	if !found {
		return nil, nil, fmt.Errorf("the %s layer has no credential for machine %q (it has %s): is %q a %s?", idx.Role, machine, strings.Join(idx.Machines, ", "), machine, idx.Role)
	}
	keep := map[string]Entry{}
	for _, f := range idx.Files {
		other := false
		for _, dir := range []string{CredentialsDir, StandInDir} {
			other = other || strings.HasPrefix(f.Name, dir+"/") && !strings.HasPrefix(f.Name, dir+"/"+machine+".")
		}
		if other {
			continue
		}
		keep[f.Name] = Entry{files[f.Name], f.Mode}
	}
	narrowed := Index{Schema: Schema, Role: idx.Role, CAHash: idx.CAHash, Machines: []string{machine}, Machine: machine}
	b, err := Pack(narrowed, keep)
	if err != nil {
		return nil, nil, err
	}
	out, _, err := Read(bytes.NewReader(b), DefaultLimits)
	return b, out, err
}
