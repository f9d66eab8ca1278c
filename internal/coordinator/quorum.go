package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
)

// EtcdStaleAfter is how old an EtcdIsVoter heartbeat may be and still be believed: twice
// k3s's refresh of an unchanged condition. An older one means no etcd leader has looked
// (a lost quorum leaves none), so a True there is not taken as healthy.
var EtcdStaleAfter = 10 * time.Minute

// Etcd is a server's etcd membership, as its Node reports it.
type Etcd struct {
	// Reported: the Node has an EtcdIsVoter condition.
	Reported bool
	// Voter: a voting member, counted in the quorum's size (healthy or not; a learner or a
	// server that is no member is not).
	Voter bool
	// Healthy: a voting member whose health the etcd leader found good, recently.
	Healthy bool
	// Why says, of a member that is not a healthy voter, what the condition says.
	Why string
}

// EtcdOf reads a server's EtcdIsVoter condition at now.
func EtcdOf(n *corev1.Node, now time.Time) Etcd {
	if n == nil {
		return Etcd{}
	}
	i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == k3s.EtcdIsVoter })
	if i < 0 {
		return Etcd{}
	}
	c := n.Status.Conditions[i]
	e := Etcd{Reported: true, Voter: true}
	switch {
	case c.Status == corev1.ConditionTrue && now.Sub(c.LastHeartbeatTime.Time) > EtcdStaleAfter:
		e.Why = fmt.Sprintf("its EtcdIsVoter condition was last refreshed at %s, more than %s ago: no etcd leader has looked since", c.LastHeartbeatTime.UTC().Format(time.RFC3339), EtcdStaleAfter)
	case c.Status == corev1.ConditionTrue:
		e.Healthy = true
	case c.Reason == k3s.EtcdReasonLearner || c.Reason == k3s.EtcdReasonNotAMember:
		e.Voter, e.Why = false, c.Reason
	default:
		// Unhealthy, or a reason k3s may add later: a voter, and not a healthy one.
		e.Why = c.Reason
		if c.Message != "" {
			e.Why += ": " + c.Message
		}
	}
	return e
}

// quorum is the servers' etcd quorum, as Decide keeps it while it grants turns: it decides
// for servers once at least three voters report (the fewest that keep a quorum through one
// server's reboot); with fewer, or none reporting, servers go one at a time as before.
type quorum struct {
	active bool
	voters []string
	need   int
	// up are the healthy voters that hold no turn.
	up map[string]bool
	// notHealthy says why each voter that is not healthy is not.
	notHealthy map[string]string
}

func newQuorum(machines []Machine) *quorum {
	q := &quorum{up: map[string]bool{}, notHealthy: map[string]string{}}
	for _, m := range machines {
		if !m.Server || !m.Etcd.Voter {
			continue
		}
		q.voters = append(q.voters, m.Name)
		switch {
		case !m.Etcd.Healthy:
			q.notHealthy[m.Name] = m.Etcd.Why
		case !m.HoldsTurn:
			q.up[m.Name] = true
		}
	}
	slices.Sort(q.voters)
	q.need = len(q.voters)/2 + 1
	q.active = len(q.voters) >= 3
	return q
}

// allows says whether m's reboot keeps the quorum, and if not, why. A voter's reboot must
// leave a quorum of healthy voters holding no turn, whether it is healthy itself or not:
// k3s calls a member Unhealthy when the leader's status check of it failed within 2 s,
// which a busy member that still votes can fail too. A learner or a server that is no
// member takes nothing from the quorum.
func (q *quorum) allows(m Machine) (bool, string) {
	if !m.Server || !m.Etcd.Voter {
		return true, ""
	}
	left := q.names(func(n string) bool { return q.up[n] && n != m.Name })
	if len(left) >= q.need {
		return true, ""
	}
	why := fmt.Sprintf("etcd quorum: %d of the %d voters (%s) must stay healthy, and %s's reboot would leave %d (%s)",
		q.need, len(q.voters), strings.Join(q.voters, ", "), m.Name, len(left), noneOr(left))
	if bad := q.unhealthy(); len(bad) > 0 {
		var s []string
		for _, n := range bad {
			s = append(s, n+" ("+q.notHealthy[n]+")")
		}
		why += "; not healthy: " + strings.Join(s, ", ")
	}
	if held := q.held(); len(held) > 0 {
		why += "; rebooting on a turn: " + strings.Join(held, ", ")
	} else if bad := without(q.unhealthy(), m.Name); len(bad) > 0 {
		why += fmt.Sprintf("; bring %s back, or, knowing that etcd keeps its quorum without them: liken approve-reboot %s --servers-down %s",
			strings.Join(bad, ", "), m.Name, strings.Join(bad, ","))
	}
	return false, why
}

// unhealthy are the voters that are not healthy.
func (q *quorum) unhealthy() []string {
	return q.names(func(n string) bool { _, bad := q.notHealthy[n]; return bad })
}

// held are the healthy voters that hold a turn.
func (q *quorum) held() []string {
	return q.names(func(n string) bool { _, bad := q.notHealthy[n]; return !q.up[n] && !bad })
}

// accepts: an operator accepted, for m's reboot, exactly the voters that are not healthy
// (its approval's serversDown) as down, and no voter holds a turn: the operator's word
// that etcd keeps its quorum without them, which liken never decides alone.
func (q *quorum) accepts(m Machine) []string {
	if len(q.held()) > 0 {
		return nil
	}
	bad := without(q.unhealthy(), m.Name)
	if len(bad) == 0 || len(without(bad, m.ServersDown...)) > 0 {
		return nil
	}
	return bad
}

// take records m's turn: it is no longer up.
func (q *quorum) take(name string) { delete(q.up, name) }

func (q *quorum) names(keep func(string) bool) []string {
	var out []string
	for _, n := range q.voters {
		if keep(n) {
			out = append(out, n)
		}
	}
	return out
}

// noneOr joins names, or says none.
func noneOr(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// quorumCondition is the Cluster's ControlPlaneQuorum condition: whether the servers' etcd
// keeps its quorum through a server's reboot now.
func quorumCondition(machines []Machine, generation int64) metav1.Condition {
	q := newQuorum(machines)
	reported := slices.ContainsFunc(machines, func(m Machine) bool { return m.Server && m.Etcd.Reported })
	up := q.names(func(n string) bool { return q.up[n] })
	switch {
	case !reported:
		return metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionUnknown, Reason: v1alpha1.ReasonNotReported, ObservedGeneration: generation,
			Message: "no server's Node reports its etcd membership (EtcdIsVoter): k3s without embedded etcd, or not reported yet; servers reboot one at a time"}
	case len(q.voters) < 3:
		return metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonTooFewVoters, ObservedGeneration: generation,
			Message: fmt.Sprintf("%d etcd voter(s) (%s): the quorum is %d, so the API stops while any server reboots; three servers keep it through one server's reboot",
				len(q.voters), noneOr(q.voters), q.need)}
	case len(up)-1 < q.need:
		var out []string
		for _, n := range q.voters {
			if why, bad := q.notHealthy[n]; bad {
				out = append(out, n+" not healthy ("+why+")")
			} else if !q.up[n] {
				out = append(out, n+" rebooting on its turn")
			}
		}
		return metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonQuorumAtRisk, ObservedGeneration: generation,
			Message: fmt.Sprintf("%d of the %d etcd voters are healthy and not rebooting (%s), and the quorum is %d: no other server may reboot until one is back (%s)",
				len(up), len(q.voters), noneOr(up), q.need, strings.Join(out, "; "))}
	}
	return metav1.Condition{Type: v1alpha1.ClusterControlPlaneQuorum, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonQuorumKept, ObservedGeneration: generation,
		Message: fmt.Sprintf("%d etcd voters (%s), %d healthy and not rebooting: the quorum of %d holds through one more server's reboot",
			len(q.voters), strings.Join(q.voters, ", "), len(up), q.need)}
}
