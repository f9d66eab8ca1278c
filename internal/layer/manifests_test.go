package layer

import (
	"strings"
	"testing"
)

func TestDecodeIsStrict(t *testing.T) {
	const cluster = "apiVersion: liken.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: liken\nspec:\n  version: \"2026.07.20-001\"\n"
	const machine = "apiVersion: liken.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: m1\nspec:\n  role: agent\n"
	for _, tt := range []struct {
		name, kind, doc, want string
	}{
		{"a Cluster", "Cluster", cluster, ""},
		{"a Machine", "Machine", machine, ""},
		{"a Machine with a leading separator", "Machine", "---\n" + machine, ""},
		{"a second document", "Cluster", cluster + "---\n" + "apiVersion: liken.dev/v1alpha1\nkind: Cluster\nspec:\n  kernelArgs: [quiet]\n", "holds 2 documents; it must hold exactly one Cluster"},
		{"a Cluster among the Machines", "Machine", strings.Replace(machine, "kind: Machine", "kind: Cluster", 1), `is a liken.dev/v1alpha1 "Cluster", not a liken.dev/v1alpha1 "Machine"`},
		{"another API group", "Machine", strings.Replace(machine, "liken.dev/v1alpha1", "cluster.x-k8s.io/v1beta1", 1), `is a cluster.x-k8s.io/v1beta1 "Machine"`},
		{"no apiVersion", "Machine", strings.Replace(machine, "apiVersion: liken.dev/v1alpha1\n", "", 1), `(no apiVersion) "Machine"`},
		{"an unknown field", "Machine", machine + "  colour: blue\n", "unknown field"},
		{"empty", "Cluster", "", "holds 0 documents"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.kind == "Cluster" {
				_, err = DecodeCluster([]byte(tt.doc))
			} else {
				_, err = DecodeMachine("machines/m1.yaml", []byte(tt.doc))
			}
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error = %v; want %q", err, tt.want)
			}
		})
	}
}
