package initd

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"liken.dev/liken/api/v1alpha1"
)

// pick finds this machine's manifest: the one whose match fits (a MAC of this machine, or
// its DMI serial), else the one install bound the disk to. None or several is an error,
// and k3s does not start.
func pick(machines []*v1alpha1.Machine, macs map[string]bool, serial, bound string) (*v1alpha1.Machine, string, error) {
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
		return nil, "", fmt.Errorf("several Machines match this hardware (%s): fix their spec.match; k3s is not started", strings.Join(names, ", "))
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
	return nil, "", fmt.Errorf("no Machine matches this hardware (MACs %s, serial %q) and install bound no name: add a match to its Machine; k3s is not started", strings.Join(have, ", "), serial)
}

// localMACs are the hardware addresses of this machine's device-backed interfaces.
func localMACs() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir("/sys/class/net")
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join("/sys/class/net", e.Name(), "device")); err != nil {
			continue
		}
		if mac := readTrim(filepath.Join("/sys/class/net", e.Name(), "address")); mac != "" {
			out[strings.ToLower(mac)] = true
		}
	}
	return out
}

var (
	supervisedMu   sync.Mutex
	supervisedPIDs = map[string]func() int{}
)

// supervised reports whether pid is a process a supervisor waits for itself.
func supervised(pid int) bool {
	supervisedMu.Lock()
	defer supervisedMu.Unlock()
	for _, current := range supervisedPIDs {
		if current() == pid {
			return true
		}
	}
	return false
}

func registerSupervised(name string, pid func() int) {
	supervisedMu.Lock()
	defer supervisedMu.Unlock()
	supervisedPIDs[name] = pid
}

// siginfoPid is the si_pid field of a SIGCHLD siginfo (offset 16 on 64-bit Linux).
func siginfoPid(info *unix.Siginfo) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(info), 16)), 4)
}
