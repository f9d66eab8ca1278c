package vm

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"liken.dev/liken/internal/manifest"
	"liken.dev/liken/test/ntpserver"
	"liken.dev/liken/test/report"
)

// TestClockBeforeK3s boots a machine whose hardware clock starts in 2001 (QEMU -rtc), with the
// Cluster naming an NTP server on the host. While the server is down, init does not start
// k3s, and says why: the clock reads earlier than the release was built. Once the server
// answers, init sets the clock from it, then starts k3s (whose preflight finds the clock
// plausible). A second boot, clock right and server up, measures what the NTP step adds.
func TestClockBeforeK3s(t *testing.T) {
	vmTest(t)
	// The server the machine reaches as 10.0.2.2 (QEMU's user network forwards the host's
	// address there to the host's loopback), silent at first: a server that is down.
	srv, err := ntpserver.Start("127.0.0.1:0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.Silence()
	server := fmt.Sprintf("10.0.2.2:%d", srv.Addr().Port)
	const mac = "52:54:00:00:01:01"
	d := installedEdited(t, "quiet liken.test=poweroff", "agent-1", "agent", func(docs []manifest.Document) {
		for _, doc := range docs {
			o := doc.Object.Object
			switch {
			case doc.Object.GetKind() == "Cluster":
				unstructured.SetNestedStringSlice(o, []string{server}, "spec", "timeServers")
			case doc.Object.GetName() == "agent-1":
				// DHCP on QEMU's user network, where the host is.
				unstructured.SetNestedField(o, map[string]any{"interfaces": []any{
					map[string]any{"name": "eth0", "mac": mac, "dhcp": true}}}, "spec", "network")
			}
		}
	})

	v := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: d}}, NICs: []string{mac}, RTCBase: "2001-01-01T00:00:00"})
	expect(t, v, "liken-init: eth0: DHCP lease", 240*time.Second)
	waiting := expect(t, v, "not starting k3s until a time server answers", 60*time.Second)
	if line := consoleLine(v.Console(), "liken-init: clock: it reads 2001-01-01T"); !strings.Contains(line, "before this release was built") {
		t.Errorf("init does not say why it waits: %q", line)
	}
	// Long enough for init to have asked several times (every 5 s).
	time.Sleep(15 * time.Second)
	if strings.Contains(v.Console(), "started k3s") {
		t.Fatal("k3s started with the clock in 2001")
	}
	srv.Answer()
	up := time.Now()
	expect(t, v, "liken-init: clock set from "+server, 60*time.Second)
	answeredAfter := time.Since(up)
	expect(t, v, "liken-init: started k3s", 60*time.Second)
	if !inOrder(v.Console(), "liken-init: clock set from "+server, "liken-init: started k3s") {
		t.Errorf("k3s started before the clock was set")
	}
	expect(t, v, "k3s-standin: preflight: clock: ok", 60*time.Second)
	line := consoleLine(v.Console(), "liken-init: clock set from")
	year := time.Now().UTC().Format("2006")
	if !strings.Contains(line, "now "+year) {
		t.Errorf("the clock was not set to this year (%s): %q", year, line)
	}
	expect(t, v, "liken-init: shutdown complete", 120*time.Second)
	poweredOff(t, v)
	report.Line("clock at boot, hardware clock in 2001, NTP server down until %s after boot: init waited without starting k3s, set the clock %s after the server came up (init asks every 5 s): %s",
		waiting.Round(time.Second), answeredAfter.Round(100*time.Millisecond), line)

	// The next boot: the hardware clock right, the server up from the start.
	v2 := bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: []Disk{{Path: d}}, NICs: []string{mac}})
	expect(t, v2, "liken-init: clock set from "+server, 240*time.Second)
	expect(t, v2, "liken-init: started k3s", 60*time.Second)
	expect(t, v2, "liken-init: shutdown complete", 120*time.Second)
	poweredOff(t, v2)
	report.Line("clock at boot, hardware clock right and NTP server up (TCG): %s", consoleLine(v2.Console(), "liken-init: clock set from"))
}

// consoleLine is the first console line holding marker.
func consoleLine(console, marker string) string {
	for _, l := range strings.Split(console, "\n") {
		if i := strings.Index(l, marker); i >= 0 {
			return strings.TrimSpace(l[i:])
		}
	}
	return ""
}
