package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"slices"
	"testing"
	"time"
)

func TestClientCertChainsToCA(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.ClientCert("liken:machine:m1", []string{"liken:machines"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatalf("certificate and key do not match: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate does not verify against its CA: %v", err)
	}
	if leaf.Subject.CommonName != "liken:machine:m1" || !slices.Equal(leaf.Subject.Organization, []string{"liken:machines"}) {
		t.Errorf("subject = %v, want CN liken:machine:m1, O liken:machines", leaf.Subject)
	}
	other, _ := NewCA("other", time.Hour)
	pool2 := x509.NewCertPool()
	pool2.AddCert(other.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool2, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("client certificate verified against an unrelated CA")
	}
}

func TestServingCertNames(t *testing.T) {
	ca, _ := NewCA("ca", time.Hour)
	p, err := ca.ServingCert("apiserver", []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(p.CertPEM)
	c, _ := x509.ParseCertificate(b.Bytes)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("serving certificate not valid for %s: %v", name, err)
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, DNSName: "example.com"}); err == nil {
		t.Error("serving certificate valid for a name it does not carry")
	}
}
