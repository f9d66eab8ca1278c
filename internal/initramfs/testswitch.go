package initramfs

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// TestBuildTag is the build tag of releases built for tests (liken release build
// --test-switches): only their init honours liken.test.* kernel arguments, which inject
// faults such as kernel panics and hangs. A normal release is built without it, so those
// switches do not exist there whatever the command line says.
const TestBuildTag = "likentest"

// IsTestSwitch reports whether a command-line key is one of the test switches.
func IsTestSwitch(key string) bool {
	return key == "liken.test" || strings.HasPrefix(key, "liken.test.")
}

// WithoutTestSwitches is c without liken.test.* when this is not a test build; it says so
// on log when it drops any, so a switch that does nothing is never a mystery.
func (c Cmdline) WithoutTestSwitches(log io.Writer) Cmdline {
	if TestSwitches {
		return c
	}
	out := Cmdline{}
	var dropped []string
	for k, v := range c {
		if IsTestSwitch(k) {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	if len(dropped) > 0 {
		sort.Strings(dropped)
		fmt.Fprintf(log, "liken-init: ignoring %s: test switches act only in releases built for tests\n", strings.Join(dropped, ", "))
	}
	return out
}
