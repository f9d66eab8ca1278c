// Package kubeconfig writes kubeconfig files for certificate-authenticated users.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Render returns a kubeconfig for server, trusting caPEM, authenticating with a client
// certificate.
func Render(server string, caPEM, certPEM, keyPEM []byte) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["liken"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	kc.AuthInfos["liken"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["liken"] = &clientcmdapi.Context{Cluster: "liken", AuthInfo: "liken"}
	kc.CurrentContext = "liken"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("rendering kubeconfig: %w", err)
	}
	return b, nil
}
