package initd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/internal/layer"
)

// TestReadManifestsIsStrict: init's reader of an unpacked layer refuses what install
// refuses, through the same decoder (layer.DecodeCluster and DecodeMachine).
func TestReadManifestsIsStrict(t *testing.T) {
	const cluster = "apiVersion: liken.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: liken\n"
	const machine = "apiVersion: liken.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: m1\nspec:\n  role: agent\n"
	for _, tt := range []struct{ name, cluster, machine, want string }{
		{"good", cluster, machine, ""},
		{"a second Cluster document", cluster + "---\n" + cluster, machine, "holds 2 documents"},
		{"a Cluster among the Machines", cluster, strings.Replace(machine, "kind: Machine", "kind: Cluster", 1), `not a liken.dev/v1alpha1 "Machine"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, layer.MachinesDir), 0o755)
			os.WriteFile(filepath.Join(dir, layer.ClusterManifest), []byte(tt.cluster), 0o644)
			os.WriteFile(filepath.Join(dir, layer.MachinesDir, "m1.yaml"), []byte(tt.machine), 0o644)
			c, ms, err := layer.ReadManifests(dir)
			if tt.want == "" {
				if err != nil || c.Name != "liken" || len(ms) != 1 || ms[0].Name != "m1" {
					t.Errorf("ReadManifests = %v, %v, %v", c, ms, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v; want %q", err, tt.want)
			}
		})
	}
}
