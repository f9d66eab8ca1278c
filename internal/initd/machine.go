package initd

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LocalMACs are the hardware addresses of this machine's device-backed interfaces.
func LocalMACs() map[string]bool {
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
