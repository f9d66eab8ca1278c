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
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/config/crd"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/internal/manifest"
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
)

// Input is what a layer is built from.
type Input struct {
	// Docs are the Cluster and Machine manifests as read from disk.
	Docs []manifest.Document
	// IdentityDir keeps the cluster identity between runs.
	IdentityDir string
	// OutDir receives server.layer, agent.layer and admin.kubeconfig.
	OutDir string
	// Server is the API URL written into the admin kubeconfig; empty means the first
	// server's first static address.
	Server string
}

// Result says what Build wrote.
type Result struct {
	Layers     map[v1alpha1.Role]string // role → path
	Sizes      map[v1alpha1.Role]int
	Digests    map[v1alpha1.Role]string
	Kubeconfig string
}

// Build validates the manifests with the API's own rules (and the rules across objects),
// loads or creates the identity, and writes one layer per role and the admin kubeconfig.
func Build(in Input) (*Result, error) {
	v, err := manifest.NewValidator()
	if err != nil {
		return nil, err
	}
	originals := map[string]*unstructured.Unstructured{}
	for _, d := range in.Docs {
		kind := d.Object.GetKind()
		if d.Object.GetAPIVersion() != v1alpha1.GroupVersion.String() || (kind != "Cluster" && kind != "Machine") {
			return nil, fmt.Errorf("%s: a layer holds only liken.dev/v1alpha1 Cluster and Machine objects, not %s %s", d.Source, d.Object.GetAPIVersion(), kind)
		}
		originals[kind+"/"+d.Object.GetName()] = d.Object.DeepCopy()
	}
	res := manifest.CheckSet(v, in.Docs)
	if !res.OK() {
		var msgs []string
		for _, o := range res.Objects {
			if len(o.Errors) > 0 {
				msgs = append(msgs, o.Doc.Source+": "+manifest.Describe(o.Doc.Object, o.Errors))
			}
		}
		msgs = append(msgs, res.SetErrors...)
		return nil, fmt.Errorf("the manifests are invalid:\n%s", strings.Join(msgs, "\n"))
	}
	id, err := LoadOrCreateIdentity(in.IdentityDir)
	if err != nil {
		return nil, err
	}

	common := map[string]entry{}
	clusterYAML, err := yaml.Marshal(originals["Cluster/"+res.Cluster.Name].Object)
	if err != nil {
		return nil, err
	}
	common[ClusterManifest] = entry{clusterYAML, 0o644}
	for _, m := range res.Machines {
		b, err := yaml.Marshal(originals["Machine/"+m.Name].Object)
		if err != nil {
			return nil, err
		}
		common[MachinesDir+"/"+m.Name+".yaml"] = entry{b, 0o644}
	}
	for name, ca := range id.CAs {
		common[TLSDir+"/"+name+".crt"] = entry{ca.CertPEM(), 0o644}
	}

	out := &Result{Layers: map[v1alpha1.Role]string{}, Sizes: map[v1alpha1.Role]int{}, Digests: map[v1alpha1.Role]string{}}
	for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
		files := map[string]entry{}
		for k, e := range common {
			files[k] = e
		}
		var machines []string
		for _, m := range res.Machines {
			if m.Spec.Role != role {
				continue
			}
			cred, err := id.MachineCredential(m.Name)
			if err != nil {
				return nil, err
			}
			files[CredentialsDir+"/"+m.Name+".crt"] = entry{cred.CertPEM, 0o644}
			files[CredentialsDir+"/"+m.Name+".key"] = entry{cred.KeyPEM, 0o600}
			machines = append(machines, m.Name)
		}
		if role == v1alpha1.RoleServer {
			for name, ca := range id.CAs {
				key, err := ca.KeyPEM()
				if err != nil {
					return nil, err
				}
				files[TLSDir+"/"+name+".key"] = entry{key, 0o600}
			}
			files[TLSDir+"/service.key"] = entry{id.ServiceKey, 0o600}
			files[TokenFile] = entry{[]byte(id.ServerToken() + "\n"), 0o600}
			files[AgentTokenFile] = entry{[]byte(id.AgentToken() + "\n"), 0o600}
			k3sManifests, err := clusterObjects(res.Machines)
			if err != nil {
				return nil, err
			}
			for k, b := range k3sManifests {
				files[K3sManifestsDir+"/"+k] = entry{b, 0o644}
			}
		} else {
			files[TokenFile] = entry{[]byte(id.AgentToken() + "\n"), 0o600}
		}
		b, err := pack(Index{Schema: Schema, Role: role, CAHash: id.CAHash(), Machines: machines}, files)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(in.OutDir, string(role)+".layer")
		if err := atomicfile.Write(path, b, 0o600); err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		out.Layers[role], out.Sizes[role], out.Digests[role] = path, len(b), "sha256:"+hex.EncodeToString(sum[:])
	}

	server := in.Server
	if server == "" {
		server = firstServerURL(res.Machines)
	}
	if server == "" {
		return nil, fmt.Errorf("no server has a static address to write into admin.kubeconfig: give --server https://HOST:6443")
	}
	admin, err := id.AdminCredential()
	if err != nil {
		return nil, err
	}
	kc, err := kubeconfig.Render(server, id.CAs["server-ca"].CertPEM(), admin.CertPEM, admin.KeyPEM)
	if err != nil {
		return nil, err
	}
	// Beside the layers, never inside: it is an operator's credential, not a machine's.
	out.Kubeconfig = filepath.Join(in.OutDir, "admin.kubeconfig")
	return out, atomicfile.Write(out.Kubeconfig, kc, 0o600)
}

func firstServerURL(machines []*v1alpha1.Machine) string {
	for _, m := range machines {
		if m.Spec.Role != v1alpha1.RoleServer || m.Spec.Network == nil {
			continue
		}
		for _, i := range m.Spec.Network.Interfaces {
			for _, a := range i.Addresses {
				host, _, _ := strings.Cut(a, "/")
				if strings.Contains(host, ":") {
					host = "[" + host + "]"
				}
				return "https://" + host + ":6443"
			}
		}
	}
	return ""
}

// clusterObjects are the objects k3s applies from its manifests directory on servers:
// liken's CRDs and every machine's RBAC.
func clusterObjects(machines []*v1alpha1.Machine) (map[string][]byte, error) {
	crds, err := crd.Files()
	if err != nil {
		return nil, err
	}
	var crdYAML bytes.Buffer
	for _, n := range sortedKeys(crds) {
		crdYAML.WriteString("---\n")
		crdYAML.Write(crds[n])
	}
	var rbac bytes.Buffer
	add := func(o any) error {
		b, err := yaml.Marshal(o)
		if err != nil {
			return err
		}
		rbac.WriteString("---\n")
		rbac.Write(b)
		return nil
	}
	if err := add(map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": v1alpha1.SecretNamespace}}); err != nil {
		return nil, err
	}
	roles, bindings := authority.SharedRBAC()
	for i := range roles {
		if err := add(roles[i]); err != nil {
			return nil, err
		}
		if err := add(bindings[i]); err != nil {
			return nil, err
		}
	}
	for _, m := range machines {
		r, b := authority.MachineRBAC(m.Name)
		if err := add(r); err != nil {
			return nil, err
		}
		if err := add(b); err != nil {
			return nil, err
		}
	}
	return map[string][]byte{"liken-crds.yaml": crdYAML.Bytes(), "liken-rbac.yaml": rbac.Bytes()}, nil
}

type entry struct {
	data []byte
	mode int64
}

// epoch is every entry's time: layers carry no build time, so equal inputs give equal bytes.
var epoch = time.Unix(0, 0).UTC()

// pack writes the index and files as a deterministic tar.gz.
func pack(idx Index, files map[string]entry) ([]byte, error) {
	names := sortedKeys(files)
	for _, n := range names {
		e := files[n]
		sum := sha256.Sum256(e.data)
		idx.Files = append(idx.Files, File{Name: n, Size: int64(len(e.data)), SHA256: hex.EncodeToString(sum[:]), Mode: e.mode})
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
		if err := write(n, files[n].data, files[n].mode); err != nil {
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

func sortedKeys[V any](m map[string]V) []string {
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
	keep := map[string]entry{}
	for _, f := range idx.Files {
		if strings.HasPrefix(f.Name, CredentialsDir+"/") && !strings.HasPrefix(f.Name, CredentialsDir+"/"+machine+".") {
			continue
		}
		keep[f.Name] = entry{files[f.Name], f.Mode}
	}
	narrowed := Index{Schema: Schema, Role: idx.Role, CAHash: idx.CAHash, Machines: []string{machine}, Machine: machine}
	b, err := pack(narrowed, keep)
	if err != nil {
		return nil, nil, err
	}
	out, _, err := Read(bytes.NewReader(b), DefaultLimits)
	return b, out, err
}
