package change

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

func base() Spec {
	return Spec{
		Cluster: v1alpha1.ClusterSpec{
			Channel:  "file:///c",
			Releases: map[string]v1alpha1.Digest{"2026.07.20-001": "sha256:aa"},
			Version:  "2026.07.20-001",
			Features: v1alpha1.K3sFeatures{Traefik: ptr(true), ServiceLB: ptr(true)},
			Network:  v1alpha1.ClusterNetwork{ServiceCIDR: "10.43.0.0/16"},
		},
		Machine: v1alpha1.MachineSpec{
			Role:       v1alpha1.RoleServer,
			NodeLabels: map[string]v1alpha1.LabelValue{"a": "1"},
		},
	}
}

func TestDiff(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Spec)
		want   []Change
	}{
		{"no change", func(*Spec) {}, nil},
		{"label", func(s *Spec) { s.Machine.NodeLabels["b"] = "2" }, []Change{
			{Field: "machine.spec.nodeLabels", Class: v1alpha1.Live, From: `{"a":"1"}`, To: `{"a":"1","b":"2"}`},
		}},
		{"packaged component off", func(s *Spec) { s.Cluster.Features.Traefik = ptr(false) }, []Change{
			{Field: "cluster.spec.features.traefik", Class: v1alpha1.RestartK3s, ServersOnly: true, From: "true", To: "false"},
		}},
		{"network and version", func(s *Spec) {
			s.Machine.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
			s.Cluster.Version = "2026.08.01-001"
		}, []Change{
			{Field: "cluster.spec.version", Class: v1alpha1.Reboot, From: `"2026.07.20-001"`, To: `"2026.08.01-001"`},
			{Field: "machine.spec.network", Class: v1alpha1.Reboot, From: "", To: `{"interfaces":[{"dhcp":true,"name":"eth0"}]}`},
		}},
		{"kernel args", func(s *Spec) { s.Machine.KernelArgs = []v1alpha1.KernelArg{"quiet"} }, []Change{
			{Field: "machine.spec.kernelArgs", Class: v1alpha1.NextBoot, To: `["quiet"]`},
		}},
		{"empty map equals absent", func(s *Spec) { s.Machine.Sysctls = v1alpha1.Sysctls{} }, nil},
		{"approval is live", func(s *Spec) {
			s.Machine.Reboot = &v1alpha1.RebootControl{Approval: &v1alpha1.RebootApproval{PendingHash: "sha256:00"}}
		}, []Change{{Field: "machine.spec.reboot", Class: v1alpha1.Live, To: `{"approval":{"pendingHash":"sha256:00"}}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			applied := base()
			desired := base()
			desired.Machine.NodeLabels = map[string]v1alpha1.LabelValue{"a": "1"}
			tt.mutate(&desired)
			got, err := Diff(applied, desired)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Diff (-want +got):\n%s", d)
			}
		})
	}
}

// TestPendingHashVector pins the canonical form: approvals written by one version of liken
// must still bind after an upgrade. Do not change the expected value.
func TestPendingHashVector(t *testing.T) {
	p := []v1alpha1.PendingChange{
		{Field: "machine.spec.network", Class: v1alpha1.Reboot, From: "", To: `{"interfaces":[{"dhcp":true,"name":"eth0"}]}`, Since: metav1.Unix(100, 0)},
		{Field: "cluster.spec.kernelArgs", Class: v1alpha1.NextBoot, From: `["quiet"]`, To: `["quiet","nosmt"]`, Since: metav1.Unix(200, 0)},
	}
	// printf 'cluster.spec.kernelArgs\tNextBoot\t["quiet"]\t["quiet","nosmt"]\nmachine.spec.network\tReboot\t\t{"interfaces":[{"dhcp":true,"name":"eth0"}]}\n' | sha256sum
	const want = "sha256:322f1d95c2a3f60978b6f60be69eb239682cc7dd2397a16b15cc4d83ce2a1719"
	got := PendingHash(p)
	if got != want {
		t.Errorf("PendingHash = %s, want %s", got, want)
	}
	// Order and since do not matter; content does.
	swapped := []v1alpha1.PendingChange{p[1], p[0]}
	swapped[0].Since = metav1.Unix(999, 0)
	if PendingHash(swapped) != got {
		t.Errorf("hash depends on order or since")
	}
	changed := append([]v1alpha1.PendingChange(nil), p...)
	changed[0].To = `{"interfaces":[]}`
	if PendingHash(changed) == got {
		t.Errorf("hash ignores a changed value")
	}
	if PendingHash(nil) != "" {
		t.Errorf("empty set has a hash")
	}
}

func TestKeepStaged(t *testing.T) {
	applied := base()
	desired := base()
	desired.Machine.NodeLabels = map[string]v1alpha1.LabelValue{"b": "2"}
	desired.Machine.KernelArgs = []v1alpha1.KernelArg{"quiet"}
	desired.Cluster.Version = "2026.08.01-001"
	desired.Cluster.Features.Traefik = ptr(false)
	got, err := Keep(applied, desired, func(fc v1alpha1.FieldClass) bool { return Staged(fc.Class) })
	if err != nil {
		t.Fatal(err)
	}
	if got.Machine.NodeLabels["b"] != "2" || *got.Cluster.Features.Traefik {
		t.Errorf("live and restart fields not taken from desired: %+v", got)
	}
	if got.Machine.KernelArgs != nil || got.Cluster.Version != "2026.07.20-001" {
		t.Errorf("staged fields not kept from applied: kernelArgs %v, version %s", got.Machine.KernelArgs, got.Cluster.Version)
	}
	changes, _ := Diff(got, desired)
	for _, c := range changes {
		if !Staged(c.Class) {
			t.Errorf("after Keep, a non-staged change remains: %+v", c)
		}
	}
	if len(changes) != 2 {
		t.Errorf("after Keep, %d changes remain, want the 2 staged ones: %+v", len(changes), changes)
	}
}
