// Package coordinator decides which machines may take a reboot turn: the disruption budget
// (maxUnavailable, counting every unavailable node, not only liken's reboots), the
// control-plane quorum guard, and a deterministic order. The decisions are pure functions
// of the cluster's state, so a restarted or new coordinator decides the same; the
// coordinator that runs them against the API (leader election, turns in the Cluster's
// status written with optimistic concurrency) is built on top of this.
package coordinator

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// Cordoned is Machine.Unavailable for a Node that is only cordoned (Ready, but
// unschedulable).
const Cordoned = "cordoned"

// Machine is one machine as the coordinator sees it.
type Machine struct {
	Name   string
	Server bool
	// Unavailable says why the machine is unavailable now (its Node NotReady or missing,
	// or Cordoned by anyone), or "" when it is available.
	Unavailable string
	// HoldsTurn: the machine holds a turn (it counts as unavailable until it gives it back).
	HoldsTurn bool
	// Waiting: the machine waits for a turn (its reboot is approved, or rebootPolicy Auto),
	// since WaitingSince.
	Waiting      bool
	WaitingSince time.Time
	// Coordinator: the machine runs the coordinator that decides; it goes last.
	Coordinator bool
	// Reclaimable: it holds a turn it was given without budget, being unavailable then,
	// and it is available again (liken's own cordon aside) before its drain ended. It keeps
	// the turn only if the budget has room for it, as any other machine would get one.
	Reclaimable bool
	// Canary: spec.rollout.canaries selects it; canaries are granted before any other.
	Canary bool
	// ServersDown are the other servers an operator accepts as down while this server,
	// unavailable itself, takes its turn (its approval's serversDown, for its pending set).
	ServersDown []string
	// Etcd is a server's etcd membership as its Node reports it (EtcdIsVoter).
	Etcd Etcd
}

// Budget is how many machines may be unavailable at once among total: a count (at least
// one), or a percentage rounded down but never below one machine. nil means one.
func Budget(maxUnavailable *intstr.IntOrString, total int) (int, error) {
	if maxUnavailable == nil {
		return 1, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(maxUnavailable, total, false)
	if err != nil {
		return 0, fmt.Errorf("disruptionBudget.maxUnavailable %q: %w", maxUnavailable.String(), err)
	}
	return max(n, 1), nil
}

// Decision is what the coordinator decided for the machines waiting for a turn.
type Decision struct {
	// Grant are the machines that may take a turn now, in order.
	Grant []string
	// Wait says, for each waiting machine not granted, what it waits for.
	Wait map[string]string
	// Despite names, for a server granted while other servers are down because an
	// operator accepted it (Machine.ServersDown), those servers.
	Despite map[string][]string
	// Unavailable says, for each machine granted without budget because it was
	// unavailable already, why it was.
	Unavailable map[string]string
	// Revoke says, for each Reclaimable holder whose turn the budget has no room for, why
	// it gives the turn back.
	Revoke map[string]string
}

// Decide grants turns to waiting machines, oldest wait first (then by name), while the
// budget allows: a machine that holds a turn or is unavailable for any reason uses the
// budget. Where three etcd voters or more report their membership on their Nodes (k3s's
// EtcdIsVoter), a server that is a healthy voter gets a turn only if the healthy voters
// holding no turn keep the quorum without it, whatever its Node's readiness says (a
// NotReady kubelet says nothing of its etcd). Where fewer report (one or two servers, or
// a datastore that is not embedded etcd), a server gets a turn only when no other server
// is unavailable (other than by a cordon) or holds a turn: one server at a time, and a
// server that is NotReady, down already, may still be a healthy etcd voter, so two of them
// wait on each other until one is back or an operator removes one from the cluster; liken
// never decides that alone. A waiting agent that is unavailable already gets its turn: it
// takes nothing more away. Canaries (spec.rollout.canaries) go first; the coordinator's
// own machine goes last: only when no other machine waits.
func Decide(machines []Machine, maxUnavailable *intstr.IntOrString) (Decision, error) {
	d := Decision{Wait: map[string]string{}, Despite: map[string][]string{}, Unavailable: map[string]string{}, Revoke: map[string]string{}}
	budget, err := Budget(maxUnavailable, len(machines))
	if err != nil {
		return d, err
	}
	var down, downServers, turnServers []string
	var reclaimable []Machine
	for _, m := range machines {
		if m.HoldsTurn && m.Reclaimable {
			reclaimable = append(reclaimable, m)
			continue
		}
		if m.Server && m.HoldsTurn {
			turnServers = append(turnServers, m.Name)
		}
		if m.HoldsTurn || m.Unavailable != "" {
			down = append(down, m.Name)
			// A cordon alone keeps a server's control plane running: it counts against
			// the budget, not against the quorum.
			if m.Server && (m.HoldsTurn || m.Unavailable != Cordoned) {
				downServers = append(downServers, m.Name)
			}
		}
	}
	// With three etcd voters or more reporting, their quorum decides for servers, not their
	// Nodes: a NotReady server whose etcd member is a healthy voter is counted as one.
	q := newQuorum(machines)
	// A turn given to a machine that was down, which is up again before it went down for
	// the turn: counted now as any machine's, after every other holder and every machine
	// down; one the budget has no room for goes back (its machine waits again).
	sort.SliceStable(reclaimable, func(i, j int) bool { return reclaimable[i].Name < reclaimable[j].Name })
	for _, m := range reclaimable {
		otherServers := without(downServers, m.Name)
		keeps, quorumWhy := q.allows(m)
		switch {
		case len(down) >= budget:
			d.Revoke[m.Name] = fmt.Sprintf("it was given its turn while unavailable, which took nothing from the budget, and is available again before its drain ended: "+
				"the disruption budget allows %d unavailable at once, and %d are: %s", budget, len(down), strings.Join(down, ", "))
		case q.active && !keeps:
			d.Revoke[m.Name] = "it was given its turn while unavailable and is available again before its drain ended: " + quorumWhy
		case !q.active && m.Server && len(without(otherServers, m.ServersDown...)) > 0:
			d.Revoke[m.Name] = "it was given its turn while unavailable and is available again before its drain ended: one server at a time: " +
				strings.Join(otherServers, ", ") + " is unavailable"
		default:
			down = append(down, m.Name)
			if m.Server {
				downServers = append(downServers, m.Name)
				turnServers = append(turnServers, m.Name)
			}
		}
	}
	var waiting []Machine
	for _, m := range machines {
		if m.Waiting && !m.HoldsTurn {
			waiting = append(waiting, m)
		}
	}
	sort.SliceStable(waiting, func(i, j int) bool {
		a, b := waiting[i], waiting[j]
		if a.Canary != b.Canary {
			return a.Canary
		}
		if a.Coordinator != b.Coordinator {
			return b.Coordinator
		}
		if !a.WaitingSince.Equal(b.WaitingSince) {
			return a.WaitingSince.Before(b.WaitingSince)
		}
		return a.Name < b.Name
	})
	for i, m := range waiting {
		otherServers := without(downServers, m.Name)
		if q.active {
			// The quorum below decides for servers; a Node's readiness says nothing of its
			// etcd member.
			otherServers = nil
		}
		bothDown := m.Server && len(otherServers) > 0 && m.Unavailable != "" && m.Unavailable != Cordoned
		// An operator accepted these servers down for this reboot: it goes on as any
		// unavailable machine's does (below), and the Event says why.
		accepted := bothDown && len(without(otherServers, m.ServersDown...)) == 0
		keeps, quorumWhy := q.allows(m)
		var quorumDespite []string
		if q.active && !keeps {
			quorumDespite = q.accepts(m)
		}
		switch {
		case q.active && !keeps && quorumDespite == nil:
			d.Wait[m.Name] = quorumWhy
		case bothDown && !accepted:
			// Both down: rebooting this one could take the last voter but one of a member
			// that only looks down (a NotReady kubelet says nothing of its etcd).
			d.Wait[m.Name] = fmt.Sprintf("one server at a time: %s is unavailable too, and this server (%s) may still be a healthy etcd voter: "+
				"liken does not reboot it while another server is down; bring %s back, or remove it from the cluster (its Machine and Node), to go on; "+
				"or, knowing that the control plane keeps its quorum without both: liken approve-reboot %s --servers-down %s",
				strings.Join(otherServers, ", "), m.Unavailable, strings.Join(otherServers, ", "), m.Name, strings.Join(otherServers, ","))
		case m.Server && len(otherServers) > 0 && !accepted:
			// Checked first: a cordoned server still serves the control plane, so even an
			// unavailable one waits while another server is down.
			d.Wait[m.Name] = "one server at a time: " + strings.Join(otherServers, ", ") + " is unavailable"
		case m.Unavailable != "":
			// Already counted as unavailable: its reboot takes nothing more from the budget
			// (the coordinator's own machine too: others could not go before it anyway).
			d.Grant = append(d.Grant, m.Name)
			q.take(m.Name)
			d.Unavailable[m.Name] = m.Unavailable
			if accepted {
				d.Despite[m.Name] = otherServers
			}
			if quorumDespite != nil {
				d.Despite[m.Name] = quorumDespite
			}
			if m.Server {
				turnServers = append(turnServers, m.Name)
				if m.Unavailable == Cordoned {
					downServers = append(downServers, m.Name)
				}
			}
		case m.Coordinator && i > 0:
			d.Wait[m.Name] = "the coordinator's own machine goes last: other machines wait for a turn"
		case len(down) >= budget:
			d.Wait[m.Name] = fmt.Sprintf("the disruption budget allows %d unavailable at once, and %d are: %s", budget, len(down), strings.Join(down, ", "))
		default:
			d.Grant = append(d.Grant, m.Name)
			q.take(m.Name)
			if quorumDespite != nil {
				d.Despite[m.Name] = quorumDespite
			}
			down = append(down, m.Name)
			if m.Server {
				downServers = append(downServers, m.Name)
				turnServers = append(turnServers, m.Name)
			}
		}
	}
	return d, nil
}

// without is list with none of names.
func without(list []string, names ...string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(names, s) {
			out = append(out, s)
		}
	}
	return out
}
