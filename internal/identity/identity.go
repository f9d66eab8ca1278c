package identity

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/pki"
)

// Identity is a cluster's identity as k3s takes it when provisioned before the first start
// of the first server (k3s docs cli/certificate.md, "Using Custom CA Certificates"): the CA
// certificates and keys k3s expects in <data-dir>/server/tls, the service-account key, and
// the passwords of the server and agent tokens. It also keeps the client certificates liken
// issued, so re-running `liken layer` gives the same layers.
type Identity struct {
	dir string
	// CAs by their file stem under server/tls, e.g. "server-ca", "etcd/peer-ca".
	CAs map[string]*pki.CA
	// ServiceKey is server/tls/service.key (PEM).
	ServiceKey []byte
	// ServerPassword and AgentPassword are the secrets of the two join tokens.
	ServerPassword, AgentPassword string
}

// caFiles are the CAs k3s needs (etcd's even without etcd, per k3s's docs).
var caFiles = []string{"server-ca", "client-ca", "request-header-ca", "etcd/peer-ca", "etcd/server-ca"}

const caLifetime = 10 * 365 * 24 * time.Hour // as k3s's own CAs

// LoadOrCreateIdentity reads the identity in dir, creating what is missing. An existing
// identity is never replaced: a cluster's CAs and tokens must outlive its layers.
func LoadOrCreateIdentity(dir string) (*Identity, error) {
	id := &Identity{dir: dir, CAs: map[string]*pki.CA{}}
	for _, name := range caFiles {
		ca, err := pki.LoadCA(dir, name)
		if errors.Is(err, os.ErrNotExist) {
			if ca, err = pki.NewCA("liken-"+strings.ReplaceAll(name, "/", "-")+"@"+time.Now().UTC().Format("20060102"), caLifetime); err == nil {
				err = saveCA(dir, name, ca)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cluster identity %s: %w", name, err)
		}
		id.CAs[name] = ca
	}
	var err error
	if id.ServiceKey, err = readOrCreate(filepath.Join(dir, "service.key"), newServiceKey); err != nil {
		return nil, err
	}
	pw, err := readOrCreate(filepath.Join(dir, "token-password"), newPassword)
	if err != nil {
		return nil, err
	}
	id.ServerPassword = strings.TrimSpace(string(pw))
	if pw, err = readOrCreate(filepath.Join(dir, "agent-token-password"), newPassword); err != nil {
		return nil, err
	}
	id.AgentPassword = strings.TrimSpace(string(pw))
	return id, nil
}

func saveCA(dir, name string, ca *pki.CA) error {
	key, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, name+".key"), key, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, name+".crt"), ca.CertPEM(), 0o644)
}

func readOrCreate(path string, create func() ([]byte, error)) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if b, err = create(); err != nil {
		return nil, err
	}
	return b, atomicfile.Write(path, b, 0o600)
}

// newServiceKey makes the service-account signing key; k3s makes an RSA 2048 key itself.
func newServiceKey() ([]byte, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
}

func newPassword() ([]byte, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return []byte(hex.EncodeToString(b) + "\n"), nil
}

// CAHash is the hash a secure k3s token carries: the SHA-256 of the server CA bundle as
// served on /cacerts, which for a single certificate is the literal bytes of
// server/tls/server-ca.crt (k3s pkg/clientaccess/token.go).
func (id *Identity) CAHash() string {
	sum := sha256.Sum256(id.CAs["server-ca"].CertPEM())
	return hex.EncodeToString(sum[:])
}

// ServerToken is the token servers join with: K10<ca-hash>::server:<password>.
func (id *Identity) ServerToken() string {
	return "K10" + id.CAHash() + "::server:" + id.ServerPassword
}

// AgentToken is the token agents join with: K10<ca-hash>::node:<password>, valid only for
// agents (servers set it as agent-token).
func (id *Identity) AgentToken() string {
	return "K10" + id.CAHash() + "::node:" + id.AgentPassword
}

// MachineCredential returns the client certificate and key a machine's agent uses (user
// liken:machine:<name>, group liken:machines), issued by the client CA once and kept.
func (id *Identity) MachineCredential(machine string) (pki.Pair, error) {
	return id.credential("machines/"+machine, authority.User(machine), []string{authority.Group})
}

// StandInNodeCredential returns the node identity liken's k3s stand-in registers with.
func (id *Identity) StandInNodeCredential(machine string) (pki.Pair, error) {
	return id.credential("stand-in/"+machine, "system:node:"+machine, []string{"system:nodes"})
}

// StandInComponents are the users of the node components liken's k3s stand-in runs, by the
// stem of their credential: k3s's agent gets the same from its server's supervisor.
var StandInComponents = map[string]string{
	"kube-proxy":     "system:kube-proxy",     // Kubernetes binds system:node-proxier to it
	"k3s-controller": "system:k3s-controller", // flannel's identity (k3s's rolebindings.yaml)
}

// StandInComponentCredential returns the credential of one of StandInComponents.
func (id *Identity) StandInComponentCredential(component string) (pki.Pair, error) {
	user, ok := StandInComponents[component]
	if !ok {
		return pki.Pair{}, fmt.Errorf("no stand-in component %q", component)
	}
	return id.credential("stand-in/"+component, user, nil)
}

// BootstrapCredential returns the servers' bootstrap credential (authority.BootstrapUser).
func (id *Identity) BootstrapCredential() (pki.Pair, error) {
	return id.credential("bootstrap", authority.BootstrapUser, nil)
}

// AdminCredential returns a client certificate for an operator in system:masters.
func (id *Identity) AdminCredential() (pki.Pair, error) {
	return id.credential("admin", "liken-admin", []string{"system:masters"})
}

func (id *Identity) credential(stem, user string, groups []string) (pki.Pair, error) {
	certPath := filepath.Join(id.dir, "issued", stem+".crt")
	keyPath := filepath.Join(id.dir, "issued", stem+".key")
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	if cerr == nil && kerr == nil && stillGood(certPEM, id.CAs["client-ca"], user) {
		return pki.Pair{CertPEM: certPEM, KeyPEM: keyPEM}, nil
	}
	p, err := id.CAs["client-ca"].ClientCert(user, groups, 365*24*time.Hour)
	if err != nil {
		return pki.Pair{}, err
	}
	if err := atomicfile.Write(keyPath, p.KeyPEM, 0o600); err != nil {
		return pki.Pair{}, err
	}
	return p, atomicfile.Write(certPath, p.CertPEM, 0o644)
}

// stillGood reports whether a kept certificate is for user, signed by ca, and valid for at
// least 30 more days.
func stillGood(certPEM []byte, ca *pki.CA, user string) bool {
	b, _ := pem.Decode(certPEM)
	if b == nil {
		return false
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil || c.Subject.CommonName != user || time.Until(c.NotAfter) < 30*24*time.Hour {
		return false
	}
	return c.CheckSignatureFrom(ca.Cert) == nil
}
