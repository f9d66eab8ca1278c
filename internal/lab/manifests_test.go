package lab

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/internal/manifest"
)

// TestManifestsPassTheAPIsRules: the Cluster and Machines `lab up` writes pass the API's own
// validation (the CRDs' schemas and CEL rules, offline), node IPs included, and each Machine
// names its private address as k3s's node IP; the Cluster names the channel's signed root.
func TestManifestsPassTheAPIsRules(t *testing.T) {
	dir := t.TempDir()
	machines := []Machine{{Name: "lab-server-1", Role: "server", MAC: "52:54:00:12:34:01", PrivateMAC: "52:54:00:76:00:10", IP: "192.168.76.10"},
		agentMachine(1, 1024, 1), agentMachine(2, 1024, 1)}
	if err := WriteManifests(dir, "http://10.0.2.2:8080/", "sha256:"+strings.Repeat("cd", 32), "2026.12.01-001", "sha256:"+strings.Repeat("ab", 32), machines); err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := manifest.NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 1+len(machines) {
		t.Fatalf("%d objects written, want a Cluster and %d Machines", len(docs), len(machines))
	}
	for _, d := range docs {
		if errs := v.Create(d.Object); len(errs) > 0 {
			t.Errorf("%s: %v", d.Source, errs.ToAggregate())
		}
	}
	// A lab recorded before its channel was signed says it takes the channel unsigned.
	old := t.TempDir()
	if err := WriteManifests(old, "http://10.0.2.2:8080/", "", "2026.12.01-001", "sha256:"+strings.Repeat("ab", 32), machines); err != nil {
		t.Fatal(err)
	}
	if od, err := manifest.Load(old); err != nil {
		t.Fatal(err)
	} else {
		for _, d := range od {
			if errs := v.Create(d.Object); len(errs) > 0 {
				t.Errorf("%s: %v", d.Source, errs.ToAggregate())
			}
			if unsigned, _, _ := unstructured.NestedBool(d.Object.Object, "spec", "insecureUnsignedChannel"); d.Object.GetKind() == "Cluster" && !unsigned {
				t.Errorf("the Cluster of an unsigned lab channel does not say insecureUnsignedChannel")
			}
		}
	}
	for _, d := range docs {
		if d.Object.GetKind() == "Cluster" {
			mirrors, _, _ := unstructured.NestedSlice(d.Object.Object, "spec", "registries", "mirrors")
			want := []any{map[string]any{"registry": DemoRegistry, "endpoints": []any{"http://10.0.2.2:8080"}}}
			if !reflect.DeepEqual(mirrors, want) {
				t.Errorf("the Cluster's registry mirrors %v, want %v (the demo's registry, served beside the channel)", mirrors, want)
			}
			if root, _, _ := unstructured.NestedString(d.Object.Object, "spec", "channelRoot"); root != "sha256:"+strings.Repeat("cd", 32) {
				t.Errorf("the Cluster's channelRoot %q, want the lab's channel's root", root)
			}
			if unsigned, _, _ := unstructured.NestedBool(d.Object.Object, "spec", "insecureUnsignedChannel"); unsigned {
				t.Errorf("the Cluster of a signed channel takes it unsigned too")
			}
		}
		for _, m := range machines {
			if d.Object.GetName() != m.Name {
				continue
			}
			ip, _, _ := unstructured.NestedString(d.Object.Object, "spec", "network", "nodeIP")
			if ip != m.IP {
				t.Errorf("%s's nodeIP %q, want its private address %s", m.Name, ip, m.IP)
			}
		}
	}
}
