package initramfs

import (
	"strings"
	"testing"
)

func TestWithoutTestSwitches(t *testing.T) {
	c := ParseCmdline("quiet liken.slot=A liken.test=poweroff liken.test.fail=panic liken.testing=1")
	var log strings.Builder
	got := c.WithoutTestSwitches(&log)
	if TestSwitches {
		if got["liken.test.fail"] != "panic" {
			t.Errorf("a test build dropped its switches: %v", got)
		}
		return
	}
	for _, k := range []string{"liken.test", "liken.test.fail"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s kept in a normal build", k)
		}
	}
	if got["liken.slot"] != "A" || got["quiet"] != "true" || got["liken.testing"] != "1" {
		t.Errorf("other arguments lost: %v", got)
	}
	if !strings.Contains(log.String(), "ignoring liken.test, liken.test.fail: test switches act only in releases built for tests") {
		t.Errorf("log %q", log.String())
	}
}
