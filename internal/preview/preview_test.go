package preview

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"liken.dev/liken/api/v1alpha1"
)

func cluster() *v1alpha1.Cluster {
	return &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "liken"}, Spec: v1alpha1.ClusterSpec{
		Version:  "2026.08.01-001",
		Releases: map[string]v1alpha1.Digest{"2026.08.01-001": "sha256:11", "2026.09.01-001": "sha256:22"},
	}}
}

func machine(name string, role v1alpha1.Role) v1alpha1.Machine {
	return v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: role}}
}

func fleet() Objects {
	return Objects{Cluster: cluster(), Machines: []v1alpha1.Machine{
		machine("server-1", v1alpha1.RoleServer), machine("server-2", v1alpha1.RoleServer), machine("agent-1", v1alpha1.RoleAgent), machine("agent-2", v1alpha1.RoleAgent),
	}}
}

// edited is a deep copy of o changed by edit.
func edited(o Objects, edit func(c *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine)) Objects {
	out := Objects{Cluster: o.Cluster.DeepCopy()}
	for _, m := range o.Machines {
		out.Machines = append(out.Machines, *m.DeepCopy())
	}
	byName := map[string]*v1alpha1.Machine{}
	for i := range out.Machines {
		byName[out.Machines[i].Name] = &out.Machines[i]
	}
	edit(out.Cluster, byName)
	return out
}

func classes(p Plan) map[string]v1alpha1.ChangeClass {
	out := map[string]v1alpha1.ChangeClass{}
	for _, m := range p.Machines {
		out[m.Name] = m.Class
	}
	return out
}

// TestCompute: each class reaches the machines it should with the class it has there, and
// the summary counts them.
func TestCompute(t *testing.T) {
	auto := v1alpha1.RebootAuto
	for _, tc := range []struct {
		name  string
		edit  func(c *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine)
		want  map[string]v1alpha1.ChangeClass // by machine; those absent: no change
		field string                          // a field the first changed machine lists
		note  string                          // in that field's note, when set
	}{
		{"nothing", func(*v1alpha1.Cluster, map[string]*v1alpha1.Machine) {}, nil, "", ""},
		{"a Cluster sysctl: live everywhere", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			c.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "10"}
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.Live, "server-2": v1alpha1.Live, "agent-1": v1alpha1.Live, "agent-2": v1alpha1.Live}, "cluster.spec.sysctls", ""},
		{"registries: k3s restarts everywhere", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			c.Spec.Registries = &v1alpha1.Registries{Mirrors: []v1alpha1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example"}}}}
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.RestartK3s, "server-2": v1alpha1.RestartK3s, "agent-1": v1alpha1.RestartK3s, "agent-2": v1alpha1.RestartK3s}, "cluster.spec.registries", ""},
		{"a servers-only feature: agents change nothing", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			off := false
			c.Spec.Features.Traefik = &off
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.RestartK3s, "server-2": v1alpha1.RestartK3s, "agent-1": v1alpha1.Live, "agent-2": v1alpha1.Live}, "", ""},
		{"kernel arguments of one machine: its next boot", func(_ *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			ms["agent-1"].Spec.KernelArgs = []v1alpha1.KernelArg{"quiet"}
		}, map[string]v1alpha1.ChangeClass{"agent-1": v1alpha1.NextBoot}, "machine.spec.kernelArgs", ""},
		{"a network change: a reboot", func(_ *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			ms["agent-2"].Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
		}, map[string]v1alpha1.ChangeClass{"agent-2": v1alpha1.Reboot}, "machine.spec.network", ""},
		{"a role change: refused", func(_ *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			ms["agent-2"].Spec.Role = v1alpha1.RoleServer
		}, map[string]v1alpha1.ChangeClass{"agent-2": v1alpha1.Immutable}, "machine.spec.role", "refuses"},
		{"the Cluster's version: every machine without its own", func(c *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			c.Spec.Version = "2026.09.01-001"
			ms["agent-2"].Spec.Version = "2026.08.01-001"
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.Reboot, "server-2": v1alpha1.Reboot, "agent-1": v1alpha1.Reboot}, "cluster.spec.version", ""},
		{"a machine's own version", func(_ *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			ms["agent-1"].Spec.Version = "2026.09.01-001"
		}, map[string]v1alpha1.ChangeClass{"agent-1": v1alpha1.Reboot}, "machine.spec.version", ""},
		{"an unpinned version: no reboot, reported", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			c.Spec.Version = "2026.10.01-001"
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.Live, "server-2": v1alpha1.Live, "agent-1": v1alpha1.Live, "agent-2": v1alpha1.Live}, "cluster.spec.version", "not pinned"},
		{"a pin moved under the running version", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			c.Spec.Releases["2026.08.01-001"] = "sha256:33"
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.Reboot, "server-2": v1alpha1.Reboot, "agent-1": v1alpha1.Reboot, "agent-2": v1alpha1.Reboot}, "cluster.spec.version", ""},
		{"a new pin only: live", func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
			c.Spec.Releases["2026.10.01-001"] = "sha256:44"
		}, map[string]v1alpha1.ChangeClass{"server-1": v1alpha1.Live, "server-2": v1alpha1.Live, "agent-1": v1alpha1.Live, "agent-2": v1alpha1.Live}, "cluster.spec.releases", ""},
		{"a policy of one machine: live", func(_ *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
			ms["agent-1"].Spec.RebootPolicy = &auto
		}, map[string]v1alpha1.ChangeClass{"agent-1": v1alpha1.Live}, "machine.spec.rebootPolicy", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := fleet()
			p, err := Compute(live, edited(live, tc.edit), false, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			got := classes(p)
			for _, m := range live.Machines {
				if got[m.Name] != tc.want[m.Name] {
					t.Errorf("%s: class %q, want %q", m.Name, got[m.Name], tc.want[m.Name])
				}
			}
			if p.Summary.Changed != (len(tc.want) > 0) {
				t.Errorf("changed %v with %d machines changing", p.Summary.Changed, len(tc.want))
			}
			if tc.field == "" {
				return
			}
			for _, m := range p.Machines {
				if m.Change != "changed" {
					continue
				}
				i := slices.IndexFunc(m.Fields, func(f Field) bool { return f.Field == tc.field })
				if i < 0 {
					t.Fatalf("%s lists %+v; want %s among them", m.Name, m.Fields, tc.field)
				}
				if !strings.Contains(m.Fields[i].Note, tc.note) {
					t.Errorf("%s's note %q does not say %q", tc.field, m.Fields[i].Note, tc.note)
				}
				if m.Follows == "" {
					t.Errorf("%s: nothing says what follows", m.Name)
				}
				break
			}
		})
	}
}

// TestComputeReboots: the reboots' turns under the budget (servers one at a time), who
// waits for an approval and who reboots on their own, and the windows and a pause.
func TestComputeReboots(t *testing.T) {
	auto := v1alpha1.RebootAuto
	two := intstr.FromInt32(2)
	live := fleet()
	wanted := edited(live, func(c *v1alpha1.Cluster, ms map[string]*v1alpha1.Machine) {
		c.Spec.Version = "2026.09.01-001"
		c.Spec.DisruptionBudget.MaxUnavailable = &two
		ms["agent-2"].Spec.RebootPolicy = &auto
		c.Spec.MaintenanceWindows = []v1alpha1.MaintenanceWindow{{Start: "02:00", Duration: metav1.Duration{Duration: time.Hour}}}
		c.Spec.Rollout = &v1alpha1.Rollout{Paused: true, PausedBy: "dana", Reason: "the canary"}
	})
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	p, err := Compute(live, wanted, false, now)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Summary
	if len(s.Reboot) != 4 || s.AtOnce != 2 || s.Turns != 2 {
		t.Errorf("reboots %v, %d at once, %d turns; want 4, 2, 2 (two servers one at a time, four machines two at a time)", s.Reboot, s.AtOnce, s.Turns)
	}
	if !slices.Equal(s.Auto, []string{"agent-2"}) || !slices.Equal(s.Approval, []string{"agent-1", "server-1", "server-2"}) {
		t.Errorf("auto %v, approval %v", s.Auto, s.Approval)
	}
	notes := strings.Join(s.Notes, "\n")
	for _, want := range []string{"the next opens at 2026-12-05T02:00:00Z", "paused", "by dana", "liken rollout resume"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes do not say %q:\n%s", want, notes)
		}
	}
	// Three servers, budget one: the servers alone take three turns, the agents two more.
	live.Machines = append(live.Machines, machine("server-3", v1alpha1.RoleServer))
	wanted = edited(live, func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) { c.Spec.Version = "2026.09.01-001" })
	if p, err = Compute(live, wanted, false, now); err != nil {
		t.Fatal(err)
	}
	if p.Summary.Turns != 5 || p.Summary.AtOnce != 1 {
		t.Errorf("five machines, budget one: %d turns, %d at once", p.Summary.Turns, p.Summary.AtOnce)
	}
}

// TestComputeNewAndDeleted: a Machine only in the wanted objects is new; one only live is
// left as it is, or deleted with prune, and then takes no part of the budget.
func TestComputeNewAndDeleted(t *testing.T) {
	live := fleet()
	wanted := edited(live, func(*v1alpha1.Cluster, map[string]*v1alpha1.Machine) {})
	wanted.Machines = append(wanted.Machines[1:], machine("agent-3", v1alpha1.RoleAgent)) // server-1 left out
	for _, prune := range []bool{false, true} {
		p, err := Compute(live, wanted, prune, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]Machine{}
		for _, m := range p.Machines {
			byName[m.Name] = m
		}
		if byName["agent-3"].Change != "new" || !slices.Equal(p.Summary.New, []string{"agent-3"}) {
			t.Errorf("prune %v: agent-3 %+v; want new", prune, byName["agent-3"])
		}
		wantS1 := map[bool]string{false: "unchanged", true: "deleted"}[prune]
		if byName["server-1"].Change != wantS1 {
			t.Errorf("prune %v: server-1 %+v; want %s", prune, byName["server-1"], wantS1)
		}
		if !p.Summary.Changed {
			t.Errorf("prune %v: a new Machine is a change", prune)
		}
	}
}

// BenchmarkCompute1000: the preview of a Cluster edit that reaches 1,000 Machines.
func BenchmarkCompute1000(b *testing.B) {
	live := Objects{Cluster: cluster()}
	for i := range 1000 {
		role := v1alpha1.RoleAgent
		if i < 3 {
			role = v1alpha1.RoleServer
		}
		live.Machines = append(live.Machines, machine(fmt.Sprintf("m-%04d", i), role))
	}
	wanted := edited(live, func(c *v1alpha1.Cluster, _ map[string]*v1alpha1.Machine) {
		c.Spec.Version = "2026.09.01-001"
		c.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": "10"}
	})
	for b.Loop() {
		p, err := Compute(live, wanted, false, time.Now())
		if err != nil || len(p.Summary.Reboot) != 1000 {
			b.Fatalf("%v, %d reboots", err, len(p.Summary.Reboot))
		}
	}
}
