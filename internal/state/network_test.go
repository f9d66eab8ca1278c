package state

import (
	"testing"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
)

func TestBootNetwork(t *testing.T) {
	good := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
	bad := &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", Addresses: []string{"10.0.3.15/24"}}}}
	staged := func(n *v1alpha1.MachineNetwork) *change.Spec {
		return &change.Spec{Machine: v1alpha1.MachineSpec{Network: n}}
	}
	armed := &Attempt{Slot: "A", Network: NetworkHash(bad), FromNetwork: NetworkHash(good)}
	for _, tc := range []struct {
		name  string
		st    State
		trial bool
		slot  string
		want  *v1alpha1.MachineNetwork
	}{
		{"nothing staged", State{}, false, "A", nil},
		{"no good network known (older state)", State{Staged: staged(bad)}, false, "A", bad},
		{"staged is the good one", State{Staged: staged(good), GoodNetwork: &GoodNetwork{good}}, false, "A", good},
		{"staged, not on trial (a power cut)", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, false, "A", good},
		{"the trial armed for it", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, true, "A", bad},
		{"a trial of another slot", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: armed}, true, "B", good},
		{"a trial armed for other settings", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: &Attempt{Slot: "A", Network: "sha256:other"}}, true, "A", good},
		{"a trial armed for no network", State{Staged: staged(bad), GoodNetwork: &GoodNetwork{good}, Attempt: &Attempt{Slot: "A"}}, true, "A", good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, how := tc.st.BootNetwork(tc.trial, tc.slot)
			if NetworkHash(got) != NetworkHash(tc.want) || how == "" {
				t.Errorf("got %+v (%s), want %+v", got, how, tc.want)
			}
		})
	}
}
