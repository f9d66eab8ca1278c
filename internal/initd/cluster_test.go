package initd

import (
	"maps"
	"slices"
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/state"
)

// TestClusterAtBoot: init renders k3s's files from the Cluster spec the agent staged last,
// so that after an edit of the registries or k3s's features the agent finds the files as it
// renders them and restarts nothing at boot (as the lab's server did at every boot); the
// layer's spec only before the agent ever ran.
func TestClusterAtBoot(t *testing.T) {
	off := false
	layer := v1alpha1.ClusterSpec{Version: "2026.12.01-001"}
	edited := v1alpha1.ClusterSpec{Version: "2026.12.01-002", Features: v1alpha1.K3sFeatures{Traefik: &off},
		Registries: &v1alpha1.Registries{Mirrors: []v1alpha1.RegistryMirror{{Registry: "registry.liken.test", Endpoints: []string{"http://10.0.2.2:5000"}}}}}
	render := func(c v1alpha1.ClusterSpec, atBoot bool) k3s.Output {
		t.Helper()
		out, err := k3s.Render(k3s.Input{Role: v1alpha1.RoleServer, NodeName: "lab-server-1", NodeIP: "192.168.76.10", Cluster: c,
			AllowMissingSecrets: atBoot, Paths: k3s.DefaultPaths})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		st   *state.State
		want v1alpha1.ClusterSpec
	}{
		{"no state: the first boot", nil, layer},
		{"nothing staged yet", &state.State{}, layer},
		{"the agent staged an edited Cluster", &state.State{Staged: &change.Spec{Cluster: edited}}, edited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := clusterAtBoot(layer, tc.st)
			// What the agent renders for the spec it staged is what init wrote.
			initFiles, agentFiles := render(got, true), render(tc.want, false)
			if !maps.EqualFunc(initFiles, agentFiles, slices.Equal) {
				t.Errorf("init's k3s files differ from the agent's:\ninit %q\nagent %q", initFiles, agentFiles)
			}
		})
	}
	// The spec init keeps is a copy: its later changes (swap off at boot) leave the state's alone.
	st := &state.State{Staged: &change.Spec{Cluster: edited}}
	got := clusterAtBoot(layer, st)
	got.Registries.Mirrors[0].Registry = "other.liken.test"
	if st.Staged.Cluster.Registries.Mirrors[0].Registry != "registry.liken.test" {
		t.Errorf("clusterAtBoot shares the state's spec")
	}
}
