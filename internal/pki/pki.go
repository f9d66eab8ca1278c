// Package pki makes the X.509 material a liken cluster needs: certificate authorities and
// the client and serving certificates they sign. Keys are ECDSA P-256, which Kubernetes
// and k3s accept everywhere they take a key.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority: its certificate and private key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Pair is a certificate with its private key, both PEM-encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed CA valid for the given lifetime.
func NewCA(commonName string, lifetime time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM returns the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM returns the CA private key, PEM-encoded.
func (ca *CA) KeyPEM() ([]byte, error) { return encodeKey(ca.Key) }

// ClientCert issues a client certificate for user (CommonName) in groups (Organization), as
// Kubernetes' x509 authenticator reads them.
func (ca *CA) ClientCert(user string, groups []string, lifetime time.Duration) (Pair, error) {
	return ca.issue(pkix.Name{CommonName: user, Organization: groups}, lifetime,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
}

// ServingCert issues a TLS server certificate for the given DNS names and IP addresses.
func (ca *CA) ServingCert(commonName string, dnsNames []string, ips []net.IP, lifetime time.Duration) (Pair, error) {
	return ca.issue(pkix.Name{CommonName: commonName}, lifetime,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, dnsNames, ips)
}

// PeerCert issues a certificate for both ends of a TLS connection (server and client), as
// etcd's members use theirs: each serves its peers and dials them with the same one.
func (ca *CA) PeerCert(commonName string, dnsNames []string, ips []net.IP, lifetime time.Duration) (Pair, error) {
	return ca.issue(pkix.Name{CommonName: commonName}, lifetime,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, dnsNames, ips)
}

func (ca *CA) issue(subject pkix.Name, lifetime time.Duration, usage []x509.ExtKeyUsage, dnsNames []string, ips []net.IP) (Pair, error) {
	if subject.CommonName == "" {
		return Pair{}, errors.New("issuing certificate: empty common name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generating key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("signing certificate for %s: %w", subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// NewKey makes a standalone private key (for signing service-account tokens, say), PEM-encoded,
// with its public key PEM-encoded.
func NewKey() (private, public []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating key: %w", err)
	}
	private, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, nil, fmt.Errorf("encoding public key: %w", err)
	}
	return private, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("encoding key: unsupported key type %T", k)
	}
	der, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		return nil, fmt.Errorf("encoding key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("reading random serial: %v", err))
	}
	return n
}

// LoadCA reads dir/NAME.crt and dir/NAME.key, as k3s keeps its CAs in server/tls.
func LoadCA(dir, name string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, name+".crt"))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, name+".key"))
	if err != nil {
		return nil, fmt.Errorf("%s.crt without its key: %w", name, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s.key: not a signing key", name)
	}
	return &CA{Cert: cert, Key: key}, nil
}
