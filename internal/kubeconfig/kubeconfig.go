// Package kubeconfig writes kubeconfig files for certificate-authenticated users. It writes
// the format itself (it is small and stable) so that init, which writes the agent's, does
// not carry client-go.
package kubeconfig

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// Render returns a kubeconfig for server, trusting caPEM, authenticating with a client
// certificate.
func Render(server string, caPEM, certPEM, keyPEM []byte) ([]byte, error) {
	if server == "" || len(caPEM) == 0 || len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, fmt.Errorf("rendering kubeconfig: server, CA, certificate and key are all needed")
	}
	if strings.ContainsAny(server, "\n\"") {
		return nil, fmt.Errorf("rendering kubeconfig: server %q is not a URL", server)
	}
	b64 := base64.StdEncoding.EncodeToString
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: liken
  cluster:
    server: "%s"
    certificate-authority-data: %s
users:
- name: liken
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: liken
  context:
    cluster: liken
    user: liken
current-context: liken
`, server, b64(caPEM), b64(certPEM), b64(keyPEM))), nil
}
