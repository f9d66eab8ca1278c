package standin

import (
	"fmt"
	"strings"
	"time"
)

// faults are the faults VM tests inject into the stand-in (LIKEN_STANDIN_FAULT): what a k3s
// or a release that goes wrong looks like from outside, so that liken's answer to it can be
// proven. A liken release without its test switches never sets them.
type faults struct {
	neverReady   bool
	podsNotReady bool
	slowStart    time.Duration
	crashAfter   time.Duration
	lateBootID   time.Duration
}

// parseFaults reads LIKEN_STANDIN_FAULT: faults separated by commas (init joins the
// machine's own fault and its release's, liken.test.k3s-fault and
// liken.test.k3s-fault-release).
func parseFaults(s string) (faults, error) {
	var f faults
	for _, one := range strings.Split(s, ",") {
		one = strings.TrimSpace(one)
		name, arg, hasArg := strings.Cut(one, "=")
		var dur *time.Duration
		switch name {
		case "":
			continue
		case "never-ready":
			f.neverReady = true
		case "pods-not-ready":
			f.podsNotReady = true
		case "slow-start":
			dur = &f.slowStart
		case "crash-after":
			dur = &f.crashAfter
		case "late-boot-id":
			dur = &f.lateBootID
		default:
			return faults{}, fmt.Errorf("unknown fault %q (never-ready, pods-not-ready, slow-start=DURATION, crash-after=DURATION, late-boot-id=DURATION)", one)
		}
		switch {
		case dur == nil && hasArg:
			return faults{}, fmt.Errorf("fault %s takes no value: %q", name, one)
		case dur != nil:
			d, err := time.ParseDuration(arg)
			if err != nil || d <= 0 {
				return faults{}, fmt.Errorf("fault %s: %q is not a positive duration", name, arg)
			}
			*dur = d
		}
	}
	return f, nil
}
