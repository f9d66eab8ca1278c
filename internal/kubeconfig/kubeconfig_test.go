package kubeconfig

import (
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// TestClientGoReadsIt: client-go (and so kubectl) must load what Render writes.
func TestClientGoReadsIt(t *testing.T) {
	b, err := Render("https://10.0.0.1:6443", []byte("CA"), []byte("CERT"), []byte("KEY"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://10.0.0.1:6443" || string(cfg.CAData) != "CA" || string(cfg.CertData) != "CERT" || string(cfg.KeyData) != "KEY" {
		t.Errorf("client-go read %+v", cfg)
	}
	if _, err := Render("", nil, nil, nil); err == nil {
		t.Error("an empty kubeconfig rendered")
	}
}
