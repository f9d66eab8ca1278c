// Package preview says, before anything moves, what a change to the Cluster and Machines
// would do to each machine: every changed field and its class from the change-class table
// (api/v1alpha1/classes.go), each machine's most disruptive class, and, for the reboots,
// the turns the disruption budget allows, the approvals and windows they wait for. It is
// the logic behind `liken diff` and `liken upgrade --dry-run`; it reads nothing itself.
package preview

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/change"
	"liken.dev/liken/internal/coordinator"
)

// Objects are a Cluster and its Machines: as they are (live) or as they would be (wanted).
type Objects struct {
	Cluster  *v1alpha1.Cluster
	Machines []v1alpha1.Machine
}

// Field is one changed field group: a class-table entry whose value differs.
type Field struct {
	// Field is the class-table path, such as "machine.spec.network".
	Field string               `json:"field"`
	Class v1alpha1.ChangeClass `json:"class"`
	// From and To are the canonical JSON of the values ("" when absent); for the release,
	// "version@digest".
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Note says why the class here is not the table's, or what else follows.
	Note string `json:"note,omitempty"`
}

// Machine is what one machine would do.
type Machine struct {
	Name string        `json:"name"`
	Role v1alpha1.Role `json:"role"`
	// Change is "changed", "unchanged", "new" (in the wanted objects only) or "deleted"
	// (in the live objects only).
	Change string  `json:"change"`
	Fields []Field `json:"fields,omitempty"`
	// Class is the most disruptive class among Fields ("" when nothing changes here).
	Class   v1alpha1.ChangeClass `json:"class,omitempty"`
	Follows string               `json:"follows,omitempty"`
}

// Plan is the preview of one change.
type Plan struct {
	// Cluster lists the Cluster's own changed fields once (each machine's Fields has those
	// that reach it).
	Cluster  []Field   `json:"cluster,omitempty"`
	Machines []Machine `json:"machines"`
	Summary  Summary   `json:"summary"`
}

// Summary counts the machines by their most disruptive class and says how the reboots
// would go.
type Summary struct {
	Changed    bool     `json:"changed"`
	Live       []string `json:"live,omitempty"`
	RestartK3s []string `json:"restartK3s,omitempty"`
	NextBoot   []string `json:"nextBoot,omitempty"`
	Reboot     []string `json:"reboot,omitempty"`
	New        []string `json:"new,omitempty"`
	Deleted    []string `json:"deleted,omitempty"`
	// Refused are the fields the API server refuses to change (class Immutable), as
	// "object: field".
	Refused []string `json:"refused,omitempty"`
	// Turns is the least number of reboot turns, one after the other, the reboots take
	// under the budget (servers one at a time); AtOnce is the budget.
	Turns  int `json:"turns,omitempty"`
	AtOnce int `json:"atOnce,omitempty"`
	// Approval are the rebooting machines that wait for liken approve-reboot (rebootPolicy
	// Manual); Auto those that reboot on their own.
	Approval []string `json:"approval,omitempty"`
	Auto     []string `json:"auto,omitempty"`
	// Notes are what else holds the reboots: a paused or halted rollout, maintenance windows.
	Notes []string `json:"notes,omitempty"`
}

// order ranks the classes by disruption.
var order = map[v1alpha1.ChangeClass]int{v1alpha1.Live: 1, v1alpha1.RestartK3s: 2, v1alpha1.NextBoot: 3, v1alpha1.Reboot: 4, v1alpha1.Immutable: 5}

// Compute previews the change from live to wanted at now (for maintenance windows). A
// Machine absent from wanted is left as it is unless prune, when it is reported deleted.
func Compute(live, wanted Objects, prune bool, now time.Time) (Plan, error) {
	var p Plan
	if live.Cluster == nil && wanted.Cluster == nil {
		return p, fmt.Errorf("no Cluster, live or wanted")
	}
	lc, wc := live.Cluster, wanted.Cluster
	if lc == nil {
		lc = wc // a first apply: nothing runs yet to compare with
	}
	if wc == nil {
		wc = lc
	}
	cf, err := change.Diff(change.Spec{Cluster: lc.Spec}, change.Spec{Cluster: wc.Spec})
	if err != nil {
		return p, err
	}
	for _, c := range cf {
		if isVersion(c.Field) {
			continue // what reaches a machine depends on its own version: per machine below
		}
		p.Cluster = append(p.Cluster, Field{Field: c.Field, Class: c.Class, From: c.From, To: c.To, Note: refusedNote(c.Class)})
		if c.Class == v1alpha1.Immutable {
			p.Summary.Refused = append(p.Summary.Refused, "Cluster "+wc.Name+": "+c.Field)
		}
	}
	if lv, wv := string(lc.Spec.Version), string(wc.Spec.Version); lv != wv {
		p.Cluster = append(p.Cluster, Field{Field: "cluster.spec.version", Class: v1alpha1.Reboot, From: lv, To: wv,
			Note: "the machines without a version of their own move to it"})
	}

	liveByName := map[string]*v1alpha1.Machine{}
	for i := range live.Machines {
		liveByName[live.Machines[i].Name] = &live.Machines[i]
	}
	wantedByName := map[string]*v1alpha1.Machine{}
	for i := range wanted.Machines {
		wantedByName[wanted.Machines[i].Name] = &wanted.Machines[i]
	}
	var names []string
	for n := range liveByName {
		names = append(names, n)
	}
	for n := range wantedByName {
		if liveByName[n] == nil {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	// The budget counts the machines that will be there: the live ones not deleted (a new
	// Machine takes none of it until its machine joins).
	total := 0
	for n := range liveByName {
		if wantedByName[n] != nil || !prune {
			total++
		}
	}
	var rebooting []*v1alpha1.Machine
	for _, name := range names {
		lm, wm := liveByName[name], wantedByName[name]
		switch {
		case lm == nil:
			p.Machines = append(p.Machines, Machine{Name: name, Role: wm.Spec.Role, Change: "new",
				Follows: "a new Machine: a machine takes it when it is installed with its layer (liken install) or found by spec.match at boot; nothing else changes"})
			p.Summary.New = append(p.Summary.New, name)
			continue
		case wm == nil && prune:
			p.Machines = append(p.Machines, Machine{Name: name, Role: lm.Spec.Role, Change: "deleted",
				Follows: "deleted: its machine keeps running as it is and changes nothing until a Machine of its name exists again; no server's bootstrap makes it again"})
			p.Summary.Deleted = append(p.Summary.Deleted, name)
			continue
		case wm == nil:
			wm = lm // not in the files: kubectl apply leaves it as it is
		}
		fields, err := machineFields(lc, lm, wc, wm)
		if err != nil {
			return p, fmt.Errorf("Machine %s: %w", name, err)
		}
		pm := Machine{Name: name, Role: wm.Spec.Role, Change: "unchanged", Fields: fields}
		for _, f := range fields {
			if order[f.Class] > order[pm.Class] {
				pm.Class = f.Class
			}
			if f.Class == v1alpha1.Immutable && !strings.HasPrefix(f.Field, "cluster.") {
				p.Summary.Refused = append(p.Summary.Refused, "Machine "+name+": "+f.Field)
			}
		}
		if len(fields) > 0 {
			pm.Change = "changed"
		}
		pm.Follows = follows(pm.Class, wm, wc)
		switch pm.Class {
		case v1alpha1.Live:
			p.Summary.Live = append(p.Summary.Live, name)
		case v1alpha1.RestartK3s:
			p.Summary.RestartK3s = append(p.Summary.RestartK3s, name)
		case v1alpha1.NextBoot:
			p.Summary.NextBoot = append(p.Summary.NextBoot, name)
		case v1alpha1.Reboot:
			p.Summary.Reboot = append(p.Summary.Reboot, name)
			rebooting = append(rebooting, wm)
		}
		p.Machines = append(p.Machines, pm)
	}
	p.Summary.Changed = len(p.Cluster) > 0 || slices.ContainsFunc(p.Machines, func(m Machine) bool { return m.Change != "unchanged" })
	if len(rebooting) > 0 {
		if err := reboots(&p.Summary, rebooting, wc, total, now); err != nil {
			return p, err
		}
	}
	return p, nil
}

// machineFields are the changed fields that reach machine m, with their class on it.
func machineFields(lc *v1alpha1.Cluster, lm *v1alpha1.Machine, wc *v1alpha1.Cluster, wm *v1alpha1.Machine) ([]Field, error) {
	diffs, err := change.Diff(change.Spec{Cluster: lc.Spec, Machine: lm.Spec}, change.Spec{Cluster: wc.Spec, Machine: wm.Spec})
	if err != nil {
		return nil, err
	}
	var out []Field
	for _, c := range diffs {
		if isVersion(c.Field) {
			continue
		}
		f := Field{Field: c.Field, Class: c.Class, From: c.From, To: c.To, Note: refusedNote(c.Class)}
		if c.ServersOnly && wm.Spec.Role != v1alpha1.RoleServer {
			// The agent renders an agent's k3s files the same either way: nothing restarts.
			f.Class, f.Note = v1alpha1.Live, "only servers' k3s configuration depends on it: nothing restarts on an agent"
		}
		out = append(out, f)
	}
	// The release: the Machine's own version, else the Cluster's, with its pin; it changes
	// for this machine only when that pair does (a Cluster version under a Machine's own
	// version changes nothing here).
	from, to := release(lm, lc), release(wm, wc)
	if from != to {
		field := "cluster.spec.version"
		if wm.Spec.Version != "" {
			field = "machine.spec.version"
		}
		f := Field{Field: field, Class: v1alpha1.Reboot, From: from, To: to}
		if strings.HasSuffix(to, "@") {
			f.Class, f.Note = v1alpha1.Live, "not pinned in the Cluster's spec.releases: nothing is written, and the machine reports the missing pin in its status"
		}
		out = append(out, f)
	}
	return out, nil
}

// release is "version@digest" of the release m would run ("version@" when unpinned; "" when
// none is set).
func release(m *v1alpha1.Machine, c *v1alpha1.Cluster) string {
	v := m.Spec.Version
	if v == "" {
		v = c.Spec.Version
	}
	if v == "" {
		return ""
	}
	return string(v) + "@" + string(c.Spec.Releases[string(v)])
}

func isVersion(field string) bool {
	return field == "cluster.spec.version" || field == "machine.spec.version"
}

func refusedNote(c v1alpha1.ChangeClass) string {
	if c == v1alpha1.Immutable {
		return "the API server refuses this change (see the field's reason in docs/reference/api.md)"
	}
	return ""
}

// follows says what happens on the machine for its most disruptive class.
func follows(c v1alpha1.ChangeClass, m *v1alpha1.Machine, cl *v1alpha1.Cluster) string {
	switch c {
	case v1alpha1.Live:
		return "applied live by its agent: nothing restarts"
	case v1alpha1.RestartK3s:
		return "its agent restarts k3s in place: pods keep running"
	case v1alpha1.NextBoot:
		return "staged: takes effect at its next boot, which nothing asks for"
	case v1alpha1.Reboot:
		s := "staged: it reboots on a disruption-budget turn, drained first, and boots the change as a trial"
		if m.EffectiveRebootPolicy(cl) == v1alpha1.RebootAuto {
			return s + " (rebootPolicy Auto: no approval)"
		}
		return s + ", after liken approve-reboot (rebootPolicy Manual)"
	case v1alpha1.Immutable:
		return "refused by the API server: nothing changes"
	}
	return ""
}

// reboots fills in how the reboots would go: the budget's turns, approvals, windows and a
// paused rollout.
func reboots(s *Summary, machines []*v1alpha1.Machine, cl *v1alpha1.Cluster, total int, now time.Time) error {
	budget, err := coordinator.Budget(cl.Spec.DisruptionBudget.MaxUnavailable, total)
	if err != nil {
		return err
	}
	servers := 0
	for _, m := range machines {
		if m.Spec.Role == v1alpha1.RoleServer {
			servers++
		}
		if m.EffectiveRebootPolicy(cl) == v1alpha1.RebootAuto {
			s.Auto = append(s.Auto, m.Name)
		} else {
			s.Approval = append(s.Approval, m.Name)
		}
	}
	s.AtOnce = budget
	s.Turns = max(servers, (len(machines)+budget-1)/budget)
	if len(s.Auto) > 0 && len(cl.Spec.MaintenanceWindows) > 0 {
		open, next, err := coordinator.Windows(cl.Spec.MaintenanceWindows, now)
		switch {
		case err != nil:
			s.Notes = append(s.Notes, "rebootPolicy Auto waits for a maintenance window, but "+err.Error())
		case open:
			s.Notes = append(s.Notes, "rebootPolicy Auto reboots start only in a maintenance window: one is open now")
		case next.IsZero():
			s.Notes = append(s.Notes, "rebootPolicy Auto reboots start only in a maintenance window, and none ever opens")
		default:
			s.Notes = append(s.Notes, "rebootPolicy Auto reboots start only in a maintenance window: the next opens at "+next.UTC().Format(time.RFC3339))
		}
	}
	if r := cl.Spec.Rollout; r.IsPaused() {
		s.Notes = append(s.Notes, coordinator.PausedMessage(r)+": no reboot starts until liken rollout resume")
	}
	if h := cl.Status.Rollout; h != nil && h.Halted != nil {
		h := h.Halted
		s.Notes = append(s.Notes, fmt.Sprintf("the rollout is halted (%s failed its trial on %s): no reboot starts until liken rollout resume or another release",
			h.What, strings.Join(h.Machines, ", ")))
	}
	return nil
}

// JSON is a field value for a sentence: the canonical JSON without the quotes of a string.
func JSON(v string) string {
	var s string
	if json.Unmarshal([]byte(v), &s) == nil {
		return s
	}
	return v
}
