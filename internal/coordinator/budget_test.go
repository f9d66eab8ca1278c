package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestBudget(t *testing.T) {
	for _, tt := range []struct {
		max   *intstr.IntOrString
		total int
		want  int
	}{
		{nil, 10, 1},
		{ptr(intstr.FromInt32(3)), 10, 3},
		{ptr(intstr.FromString("10%")), 100, 10},
		{ptr(intstr.FromString("10%")), 15, 1}, // rounded down
		{ptr(intstr.FromString("10%")), 5, 1},  // never below one
		{ptr(intstr.FromString("50%")), 5, 2},
		{ptr(intstr.FromString("100%")), 4, 4},
	} {
		got, err := Budget(tt.max, tt.total)
		if err != nil || got != tt.want {
			t.Errorf("Budget(%v, %d) = %d, %v; want %d", tt.max, tt.total, got, err, tt.want)
		}
	}
	if _, err := Budget(ptr(intstr.FromString("ten")), 5); err == nil {
		t.Error("a malformed maxUnavailable was accepted")
	}
}

func ptr[T any](v T) *T { return &v }

func TestDecide(t *testing.T) {
	t0 := time.Unix(1785000000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	agent := func(name string, since int) Machine {
		return Machine{Name: name, Waiting: true, WaitingSince: at(since)}
	}
	server := func(name string, since int) Machine { m := agent(name, since); m.Server = true; return m }
	idle := func(m Machine) Machine { m.Waiting = false; return m }
	down := func(m Machine, why string) Machine { m.Unavailable = why; return m }
	holds := func(m Machine) Machine { m.HoldsTurn = true; return m }
	coord := func(m Machine) Machine { m.Coordinator = true; return m }
	two := ptr(intstr.FromInt32(2))
	for _, tt := range []struct {
		name     string
		machines []Machine
		max      *intstr.IntOrString
		grant    []string
		wait     map[string]string // machine → a phrase its reason holds
	}{
		{"one at a time, oldest first", []Machine{agent("a2", 5), agent("a1", 9), agent("a3", 1)}, nil,
			[]string{"a3"}, map[string]string{"a1": "allows 1 unavailable at once, and 1 are: a3", "a2": "allows 1"}},
		{"same wait: by name", []Machine{agent("b", 1), agent("a", 1)}, two, []string{"a", "b"}, nil},
		{"a node down for another reason uses the budget", []Machine{agent("a1", 1), idle(down(agent("a2", 0), "NotReady"))}, nil,
			nil, map[string]string{"a1": "and 1 are: a2"}},
		{"an admin's cordon counts", []Machine{agent("a1", 1), agent("a2", 2), idle(down(agent("a3", 0), "cordoned"))}, two,
			[]string{"a1"}, map[string]string{"a2": "allows 2 unavailable at once, and 2 are: a3, a1"}},
		{"a holder keeps its share", []Machine{holds(agent("a1", 0)), agent("a2", 1)}, nil, nil, map[string]string{"a2": "are: a1"}},
		{"servers one at a time", []Machine{server("s1", 1), server("s2", 2), agent("a1", 3)}, ptr(intstr.FromInt32(3)),
			[]string{"s1", "a1"}, map[string]string{"s2": "one server at a time: s1"}},
		{"no server while another is down", []Machine{server("s1", 1), idle(down(server("s2", 0), "NotReady")), idle(server("s3", 0))}, ptr(intstr.FromInt32(3)),
			nil, map[string]string{"s1": "one server at a time: s2"}},
		{"an unavailable machine takes its turn", []Machine{down(agent("a1", 1), "NotReady"), agent("a2", 2)}, nil,
			[]string{"a1"}, map[string]string{"a2": "are: a1"}},
		{"the coordinator goes last", []Machine{coord(server("s1", 0)), agent("a1", 5)}, two,
			[]string{"a1"}, map[string]string{"s1": "goes last"}},
		{"the coordinator alone", []Machine{coord(server("s1", 0)), idle(agent("a1", 5))}, nil, []string{"s1"}, nil},
		{"a single-server cluster", []Machine{server("s1", 0)}, nil, []string{"s1"}, nil},
		{"two NotReady servers: neither goes by itself", []Machine{down(server("s1", 1), "NotReady"), down(server("s2", 2), "NotReady"), idle(server("s3", 0))}, ptr(intstr.FromInt32(3)),
			nil, map[string]string{"s1": "s2 is unavailable too, and this server (NotReady) may still be a healthy etcd voter", "s2": "remove it from the cluster"}},
		{"a NotReady server waits while another server is down", []Machine{down(server("s1", 1), "NotReady"), idle(down(server("s2", 0), "no Node")), idle(server("s3", 0))}, ptr(intstr.FromInt32(3)),
			nil, map[string]string{"s1": "bring s2 back"}},
		{"an unavailable server waits while another server holds a turn", []Machine{holds(server("s1", 0)), down(server("s2", 1), "cordoned"), down(server("s3", 2), "NotReady")}, ptr(intstr.FromInt32(3)),
			nil, map[string]string{"s2": "one server at a time: s1", "s3": "one server at a time: s1"}},
		{"two unavailable servers: one goes", []Machine{down(server("s1", 1), "cordoned"), down(server("s2", 2), "cordoned"), idle(server("s3", 0))}, ptr(intstr.FromInt32(3)),
			[]string{"s1"}, map[string]string{"s2": "one server at a time: s1"}},
		{"a cordoned server counts against the budget, not the quorum", []Machine{server("s1", 1), idle(down(server("s2", 0), "cordoned"))}, two,
			[]string{"s1"}, nil},
		{"a cordoned coordinator goes at once: nobody could go before it", []Machine{coord(down(agent("c1", 0), "cordoned")), agent("a1", 5)}, nil,
			[]string{"c1"}, map[string]string{"a1": "are: c1"}},
		{"nothing waits", []Machine{idle(agent("a1", 0))}, nil, nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) { decided(t, tt.machines, tt.max, tt.grant, tt.wait) })
	}
}

// decided checks Decide's grants for machines, and that exactly the machines of wait wait,
// each saying its phrase.
func decided(t *testing.T, machines []Machine, max *intstr.IntOrString, grant []string, wait map[string]string) Decision {
	t.Helper()
	d, err := Decide(machines, max)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(grant, d.Grant); diff != "" {
		t.Errorf("grants (-want +got):\n%s", diff)
	}
	if len(d.Wait) != len(wait) {
		t.Errorf("waits %v; want %d", d.Wait, len(wait))
	}
	for m, phrase := range wait {
		if !strings.Contains(d.Wait[m], phrase) {
			t.Errorf("%s waits because %q; want it to say %q", m, d.Wait[m], phrase)
		}
	}
	return d
}

// TestDecideServersDownAccepted: a NotReady server that waits while another server is down
// goes only when an operator accepted exactly the servers down (its approval's
// serversDown), and the decision says so; an available server is never let go by it.
func TestDecideServersDownAccepted(t *testing.T) {
	three := ptr(intstr.FromInt32(3))
	server := func(name string, why string, accepts ...string) Machine {
		return Machine{Name: name, Server: true, Unavailable: why, Waiting: true, WaitingSince: time.Unix(1785000000, 0), ServersDown: accepts}
	}
	idle := func(m Machine) Machine { m.Waiting = false; return m }
	for _, tt := range []struct {
		name     string
		machines []Machine
		grant    []string
		despite  []string
		wait     string // a phrase s1's reason holds
	}{
		{"not accepted: it waits, and says how to go on", []Machine{server("s1", "NotReady"), idle(server("s2", "no Node")), idle(server("s3", ""))},
			nil, nil, "or, knowing that the control plane keeps its quorum without both: liken approve-reboot s1 --servers-down s2"},
		{"accepted: it goes", []Machine{server("s1", "NotReady", "s2"), idle(server("s2", "no Node")), idle(server("s3", ""))},
			[]string{"s1"}, []string{"s2"}, ""},
		{"another server down than the one accepted", []Machine{server("s1", "NotReady", "s2"), idle(server("s2", "")), idle(server("s4", "NotReady")), idle(server("s3", ""))},
			nil, nil, "bring s4 back"},
		{"one more down than accepted", []Machine{server("s1", "NotReady", "s2"), idle(server("s2", "no Node")), idle(server("s4", "NotReady")), idle(server("s3", ""))},
			nil, nil, "bring s2, s4 back"},
		{"an available server still waits: its reboot would take a voter away", []Machine{server("s1", "", "s2"), idle(server("s2", "no Node")), idle(server("s3", ""))},
			nil, nil, "one server at a time: s2 is unavailable"},
		{"a cordoned server is available to etcd: it waits too", []Machine{server("s1", Cordoned, "s2"), idle(server("s2", "no Node")), idle(server("s3", ""))},
			nil, nil, "one server at a time: s2 is unavailable"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Decide(tt.machines, three)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.grant, d.Grant); diff != "" {
				t.Errorf("grants (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.despite, d.Despite["s1"]); diff != "" {
				t.Errorf("servers down accepted (-want +got):\n%s", diff)
			}
			if !strings.Contains(d.Wait["s1"], tt.wait) || (tt.wait == "") != (d.Wait["s1"] == "") {
				t.Errorf("s1 waits because %q; want %q", d.Wait["s1"], tt.wait)
			}
		})
	}
}

// TestDecideNeverExceedsTheBudget: over many random fleets, the machines unavailable after
// the grants never exceed the budget unless they already did, and at most one server is down
// unless more already were.
func TestDecideNeverExceedsTheBudget(t *testing.T) {
	seed := uint64(1)
	rnd := func(n int) int { seed = seed*6364136223846793005 + 1442695040888963407; return int(seed>>33) % n }
	for run := 0; run < 2000; run++ {
		n := 1 + rnd(12)
		var ms []Machine
		for i := 0; i < n; i++ {
			m := Machine{Name: string(rune('a' + i)), Server: rnd(3) == 0, Waiting: rnd(2) == 0, HoldsTurn: rnd(8) == 0,
				WaitingSince: time.Unix(int64(rnd(5)), 0)}
			if rnd(6) == 0 {
				m.Unavailable = "NotReady"
			}
			ms = append(ms, m)
		}
		ms[rnd(n)].Coordinator = true
		limit := ptr(intstr.FromInt32(int32(1 + rnd(4))))
		d, err := Decide(ms, limit)
		if err != nil {
			t.Fatal(err)
		}
		budget, _ := Budget(limit, n)
		granted := map[string]bool{}
		for _, g := range d.Grant {
			granted[g] = true
		}
		before, after, serversBefore, serversAfter := 0, 0, 0, 0
		for _, m := range ms {
			if !m.Server || !granted[m.Name] {
				continue
			}
			// A server's turn: no other server down or holding a turn, NotReady ones included.
			for _, o := range ms {
				if o.Server && o.Name != m.Name && (o.HoldsTurn || (o.Unavailable != "" && o.Unavailable != Cordoned)) {
					t.Fatalf("run %d: server %s granted while server %s is down (%q, turn %v): %+v", run, m.Name, o.Name, o.Unavailable, o.HoldsTurn, ms)
				}
			}
		}
		for _, m := range ms {
			wasDown := m.HoldsTurn || m.Unavailable != ""
			if wasDown {
				before++
			}
			if wasDown || granted[m.Name] {
				after++
			}
			if m.Server && wasDown {
				serversBefore++
			}
			if m.Server && (wasDown || granted[m.Name]) {
				serversAfter++
			}
		}
		if after > max(budget, before) || serversAfter > max(1, serversBefore) {
			t.Fatalf("run %d: %d down after the grants (%d before, budget %d), servers %d (%d before): %+v → %v", run, after, before, budget, serversAfter, serversBefore, ms, d.Grant)
		}
	}
}
