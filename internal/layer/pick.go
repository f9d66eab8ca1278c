package layer

import (
	"fmt"
	"sort"
	"strings"

	"liken.dev/liken/api/v1alpha1"
)

// Pick finds this machine's manifest: the one whose match fits (a MAC of this machine, or
// its DMI serial), else the one install bound the disk to (bound). None or several is an
// error. It returns how the Machine was found, in words.
func Pick(machines []*v1alpha1.Machine, macs map[string]bool, serial, bound string) (*v1alpha1.Machine, string, error) {
	var found []*v1alpha1.Machine
	var why []string
	for _, m := range machines {
		if m.Spec.Match == nil {
			continue
		}
		for _, mac := range m.Spec.Match.MACs {
			if macs[strings.ToLower(string(mac))] {
				found, why = append(found, m), append(why, "MAC "+strings.ToLower(string(mac)))
				break
			}
		}
		if s := m.Spec.Match.Serial; s != "" && s == serial && (len(found) == 0 || found[len(found)-1] != m) {
			found, why = append(found, m), append(why, "serial "+s)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], why[0], nil
	case len(found) > 1:
		var names []string
		for _, m := range found {
			names = append(names, m.Name)
		}
		return nil, "", fmt.Errorf("several Machines match this hardware (%s): fix their spec.match", strings.Join(names, ", "))
	}
	for _, m := range machines {
		if m.Name == bound {
			return m, "the name bound at install", nil
		}
	}
	var have []string
	for mac := range macs {
		have = append(have, mac)
	}
	sort.Strings(have)
	return nil, "", fmt.Errorf("no Machine matches this hardware (MACs %s, serial %q) and install bound no name: add a match to its Machine", strings.Join(have, ", "), serial)
}
