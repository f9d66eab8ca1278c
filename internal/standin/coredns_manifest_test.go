package standin

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// TestCoreDNSManifest: k3s's coredns.yaml as the stand-in stages it holds k3s's six objects,
// with the cluster's DNS address, domain and the release's image substituted and no
// template variable left; an address that is none is refused.
func TestCoreDNSManifest(t *testing.T) {
	m, err := coreDNSManifest("10.43.0.10", "cluster.local", "docker.io/liken/stand-in-coredns:1.15.0")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(m, []byte("%{")) {
		t.Errorf("a template variable is left:\n%s", m)
	}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(m), 4096)
	var kinds []string
	for {
		var u unstructured.Unstructured
		if err := d.Decode(&u.Object); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, u.GetKind()+"/"+u.GetName())
		switch u.GetKind() {
		case "Service":
			if ip, _, _ := unstructured.NestedString(u.Object, "spec", "clusterIP"); ip != "10.43.0.10" {
				t.Errorf("kube-dns's clusterIP %q", ip)
			}
		case "Deployment":
			cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			if img := cs[0].(map[string]any)["image"]; img != "docker.io/liken/stand-in-coredns:1.15.0" {
				t.Errorf("CoreDNS's image %v", img)
			}
		case "ConfigMap":
			cf, _, _ := unstructured.NestedString(u.Object, "data", "Corefile")
			if !strings.Contains(cf, "kubernetes cluster.local in-addr.arpa ip6.arpa {") {
				t.Errorf("the Corefile does not serve cluster.local:\n%s", cf)
			}
		}
	}
	want := "ServiceAccount/coredns ClusterRole/system:coredns ClusterRoleBinding/system:coredns ConfigMap/coredns Deployment/coredns Service/kube-dns"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("objects %s, want %s", got, want)
	}
	if _, err := coreDNSManifest("dns", "cluster.local", "x"); err == nil {
		t.Error("a cluster DNS that is no address was taken")
	}
}
