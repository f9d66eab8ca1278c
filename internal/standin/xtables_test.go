package standin

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/release"
)

// TestXtablesThroughTheStandIn stages Debian's iptables as a stand-in release carries it and
// runs it as the stand-in's xtables-nft-multi runs it (xtablesCommand), chrooted into the
// stage (nothing but what was staged) in a network namespace of its own: iptables-restore
// writes a NAT chain with a MASQUERADE rule (an extension loaded from ext/, as kube-proxy's
// and flannel's rules need), and iptables-save reads it back.
func TestXtablesThroughTheStandIn(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chroot and a network namespace: needs root")
	}
	stage := t.TempDir()
	if err := release.StageStandInXtables(stage); err != nil {
		t.Fatal(err)
	}
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("liken-xtables-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	run := func(stdin, name string, args ...string) string {
		t.Helper()
		argv, env, ok := xtablesCommand(stage, apirelease.StandInXtablesDir, name, args, []string{"PATH=/nonexistent"})
		if !ok {
			t.Fatalf("xtablesCommand found no xtables-nft-multi in the stage's %s", apirelease.StandInXtablesDir)
		}
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns, chroot, stage}, argv...)...)
		cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v in the stage alone: %v: %s", name, args, err, out)
		}
		return string(out)
	}
	if out := run("", "iptables", "-V"); !strings.Contains(out, "nf_tables") {
		t.Errorf("iptables -V: %s, want the nf_tables backend", out)
	}
	rule := "-A LIKEN-TEST -s 10.42.0.0/16 ! -d 10.42.0.0/16 -j MASQUERADE --random-fully"
	run("*nat\n:LIKEN-TEST - [0:0]\n"+rule+"\nCOMMIT\n", "iptables-restore")
	if out := run("", "iptables-save", "-t", "nat"); !strings.Contains(out, rule) {
		t.Errorf("iptables-save does not give back the rule %q:\n%s", rule, out)
	}
}
