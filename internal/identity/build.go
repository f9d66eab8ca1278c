package identity

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/config/crd"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/kubeconfig"
	"liken.dev/liken/internal/layer"
	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/internal/policy"
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
	// StandInNodeCredentials adds, for each machine, a node certificate (system:node:<name>)
	// for liken's k3s stand-in, which has no k3s supervisor to get one from. Tests only: a
	// layer for real k3s never carries them.
	StandInNodeCredentials bool
}

// Result says what Build wrote.
type Result struct {
	Layers     map[v1alpha1.Role]string // role → path
	Sizes      map[v1alpha1.Role]int
	Digests    map[v1alpha1.Role]string
	Kubeconfig string
}

// BuildLayers validates the manifests with the API's own rules (and the rules across objects),
// loads or creates the identity, and writes one layer per role and the admin kubeconfig.
func BuildLayers(in Input) (*Result, error) {
	v, err := manifest.NewValidator()
	if err != nil {
		return nil, err
	}
	var docs []manifest.Document
	for _, d := range in.Docs {
		kind := d.Object.GetKind()
		if d.Object.GetAPIVersion() != v1alpha1.GroupVersion.String() || (kind != "Cluster" && kind != "Machine") {
			return nil, fmt.Errorf("%s: a layer holds only liken.dev/v1alpha1 Cluster and Machine objects, not %s %s", d.Source, d.Object.GetAPIVersion(), kind)
		}
		docs = append(docs, manifest.Document{Source: d.Source, Object: d.Object.DeepCopy()})
	}
	// The layer carries the objects as the API server stores them, defaults applied, so
	// init renders k3s's files from the same values the agent later reads from the API.
	res := manifest.CheckSet(v, docs)
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

	defaulted := map[string]*unstructured.Unstructured{}
	for _, o := range res.Objects {
		defaulted[o.Doc.Object.GetKind()+"/"+o.Doc.Object.GetName()] = o.Doc.Object
	}
	common := map[string]layer.Entry{}
	clusterYAML, err := yaml.Marshal(defaulted["Cluster/"+res.Cluster.Name].Object)
	if err != nil {
		return nil, err
	}
	common[layer.ClusterManifest] = layer.Entry{Data: clusterYAML, Mode: 0o644}
	for _, m := range res.Machines {
		b, err := yaml.Marshal(defaulted["Machine/"+m.Name].Object)
		if err != nil {
			return nil, err
		}
		common[layer.MachinesDir+"/"+m.Name+".yaml"] = layer.Entry{Data: b, Mode: 0o644}
	}
	for name, ca := range id.CAs {
		common[layer.TLSDir+"/"+name+".crt"] = layer.Entry{Data: ca.CertPEM(), Mode: 0o644}
	}

	out := &Result{Layers: map[v1alpha1.Role]string{}, Sizes: map[v1alpha1.Role]int{}, Digests: map[v1alpha1.Role]string{}}
	for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
		files := map[string]layer.Entry{}
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
			files[layer.CredentialsDir+"/"+m.Name+".crt"] = layer.Entry{Data: cred.CertPEM, Mode: 0o644}
			files[layer.CredentialsDir+"/"+m.Name+".key"] = layer.Entry{Data: cred.KeyPEM, Mode: 0o600}
			if in.StandInNodeCredentials {
				node, err := id.StandInNodeCredential(m.Name)
				if err != nil {
					return nil, err
				}
				files[layer.StandInDir+"/"+m.Name+".crt"] = layer.Entry{Data: node.CertPEM, Mode: 0o644}
				files[layer.StandInDir+"/"+m.Name+".key"] = layer.Entry{Data: node.KeyPEM, Mode: 0o600}
			}
			machines = append(machines, m.Name)
		}
		if in.StandInNodeCredentials {
			for comp := range StandInComponents {
				cred, err := id.StandInComponentCredential(comp)
				if err != nil {
					return nil, err
				}
				files[layer.StandInComponentsDir+"/"+comp+".crt"] = layer.Entry{Data: cred.CertPEM, Mode: 0o644}
				files[layer.StandInComponentsDir+"/"+comp+".key"] = layer.Entry{Data: cred.KeyPEM, Mode: 0o600}
			}
		}
		if role == v1alpha1.RoleServer {
			for name, ca := range id.CAs {
				key, err := ca.KeyPEM()
				if err != nil {
					return nil, err
				}
				files[layer.TLSDir+"/"+name+".key"] = layer.Entry{Data: key, Mode: 0o600}
			}
			files[layer.TLSDir+"/service.key"] = layer.Entry{Data: id.ServiceKey, Mode: 0o600}
			boot, err := id.BootstrapCredential()
			if err != nil {
				return nil, err
			}
			files[layer.BootstrapCert] = layer.Entry{Data: boot.CertPEM, Mode: 0o644}
			files[layer.BootstrapKey] = layer.Entry{Data: boot.KeyPEM, Mode: 0o600}
			files[layer.TokenFile] = layer.Entry{Data: []byte(id.ServerToken() + "\n"), Mode: 0o600}
			files[layer.AgentTokenFile] = layer.Entry{Data: []byte(id.AgentToken() + "\n"), Mode: 0o600}
			k3sManifests, err := clusterObjects(res.Machines)
			if err != nil {
				return nil, err
			}
			for k, b := range k3sManifests {
				files[layer.K3sManifestsDir+"/"+k] = layer.Entry{Data: b, Mode: 0o644}
			}
		} else {
			files[layer.TokenFile] = layer.Entry{Data: []byte(id.AgentToken() + "\n"), Mode: 0o600}
		}
		b, err := layer.Pack(layer.Index{Schema: layer.Schema, Role: role, CAHash: id.CAHash(), Machines: machines}, files)
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
		server = k3s.FirstServerURL(res.Machines)
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

// clusterObjects are the objects k3s applies from its manifests directory on servers:
// liken's CRDs, its change warnings and every machine's RBAC.
func clusterObjects(machines []*v1alpha1.Machine) (map[string][]byte, error) {
	crds, err := crd.Files()
	if err != nil {
		return nil, err
	}
	var crdYAML bytes.Buffer
	for _, n := range layer.SortedKeys(crds) {
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
	bcr, bcrb, broles, bbindings := authority.BootstrapRBAC()
	for _, o := range []any{bcr, bcrb, broles[0], bbindings[0], broles[1], bbindings[1]} {
		if err := add(o); err != nil {
			return nil, err
		}
	}
	coord, lease := authority.CoordinatorRBAC()
	if err := add(coord); err != nil {
		return nil, err
	}
	if err := add(lease); err != nil {
		return nil, err
	}
	for _, m := range machines {
		r, b := authority.MachineRBAC(m.Name)
		if err := add(r); err != nil {
			return nil, err
		}
		if err := add(b); err != nil {
			return nil, err
		}
		if m.Spec.Role == v1alpha1.RoleServer {
			crb, rb := authority.ServerRBAC(m.Name)
			if err := add(crb); err != nil {
				return nil, err
			}
			if err := add(rb); err != nil {
				return nil, err
			}
		}
	}
	// The change warnings, beside the CRDs they speak of (internal/policy).
	var policies bytes.Buffer
	for _, w := range policy.ChangeWarnings() {
		for _, o := range []any{w.Policy, w.Binding} {
			b, err := yaml.Marshal(o)
			if err != nil {
				return nil, err
			}
			policies.WriteString("---\n")
			policies.Write(b)
		}
	}
	return map[string][]byte{"liken-crds.yaml": crdYAML.Bytes(), "liken-rbac.yaml": rbac.Bytes(), "liken-policies.yaml": policies.Bytes()}, nil
}
