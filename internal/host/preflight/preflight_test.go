package preflight

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/host/k3s"
)

func TestClock(t *testing.T) {
	built := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		now  time.Time
		ok   bool
	}{
		{"an RTC reset to 2001", time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"a second before the build", built.Add(-time.Second), false},
		{"the build time", built, true},
		{"a year later", built.AddDate(1, 0, 0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Host{NotBefore: built, Now: func() time.Time { return tc.now }}.Clock()
			if (err == nil) != tc.ok {
				t.Fatalf("Clock() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "2026-11-30T12:00:00Z") {
				t.Errorf("the error does not say the build time: %v", err)
			}
		})
	}
}

func TestCgroups(t *testing.T) {
	all := "cpuset cpu io memory hugetlb pids rdma misc"
	for _, tc := range []struct {
		name, controllers, subtree, want string
	}{
		{"all enabled", all, "cpuset cpu io memory pids", ""},
		{"memory not offered", "cpuset cpu io pids", "cpuset cpu io pids", "offers no memory"},
		{"pids not enabled below the root", all, "cpuset cpu memory", "pids controller is not enabled"},
		{"nothing enabled", all, "", "cpu controller is not enabled"},
		{"cgroup v1 (no cgroup.controllers)", "", "", "no cgroup v2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.controllers != "" {
				os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte(tc.controllers+"\n"), 0o644)
				os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(tc.subtree+"\n"), 0o644)
			}
			err := Host{CgroupDir: dir}.Cgroups()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Cgroups() = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestKernelLog(t *testing.T) {
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		t.Skipf("this host has no /dev/kmsg (%v); the VM tier checks a liken machine's", err)
	}
	plain := filepath.Join(t.TempDir(), "kmsg")
	os.WriteFile(plain, nil, 0o644)
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/dev/kmsg", true},
		{plain, false},
		{"/dev/no-such-kmsg", false},
	} {
		if err := (Host{Kmsg: tc.path}).KernelLog(); (err == nil) != tc.ok {
			t.Errorf("KernelLog(%s) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
}

// TestModprobe: k3s's calls go to the modprobe found through PATH with k3s's argv; a
// failed required call fails, a failed nft-expr-counter does not.
func TestModprobe(t *testing.T) {
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	// The host side of a unit test: a modprobe that records its argv and fails on one name.
	script := fmt.Sprintf("#!/bin/sh\necho \"$@\" >> %s\n[ \"$2\" != \"$LIKEN_FAIL\" ]\n", calls)
	os.WriteFile(filepath.Join(dir, "modprobe"), []byte(script), 0o755)
	for _, tc := range []struct {
		fail string
		ok   bool
	}{
		{"none", true},
		{"nft-expr-counter", true},
		{"br_netfilter", false},
	} {
		t.Run(tc.fail, func(t *testing.T) {
			os.Remove(calls)
			t.Setenv("LIKEN_FAIL", tc.fail)
			h := Host{PATH: dir}
			// exec passes the environment it is given: keep LIKEN_FAIL for the script.
			prog := filepath.Join(dir, "modprobe")
			h.Modprobe = func(name string) error {
				return exec.Command(prog, "--", name).Run()
			}
			err := h.ModprobeAll(io.Discard)
			if (err == nil) != tc.ok {
				t.Fatalf("ModprobeAll = %v, want ok %v", err, tc.ok)
			}
			b, _ := os.ReadFile(calls)
			if tc.ok && !strings.Contains(string(b), "-- nft-chain-2-nat\n") {
				t.Errorf("calls made:\n%s", b)
			}
		})
	}
	// Through PATH, with no hook: modprobe is found and run with k3s's argv.
	os.Remove(calls)
	t.Setenv("LIKEN_FAIL", "none")
	if err := (Host{PATH: "/nonexistent:" + dir}).ModprobeAll(io.Discard); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(calls)
	if got := strings.Count(string(b), "\n"); got != len(K3sModprobeCalls) || !strings.HasPrefix(string(b), "-- overlay\n") {
		t.Errorf("modprobe through PATH got:\n%s", b)
	}
	if err := (Host{PATH: t.TempDir()}).ModprobeAll(io.Discard); err == nil || !strings.Contains(err.Error(), "no modprobe") {
		t.Errorf("no modprobe on PATH: %v", err)
	}
}

// TestIptablesThroughK3sPATH lays out a k3s data directory as k3s-root packs it (bin/aux's
// iptables names are links to a /bin/sh script; xtables-nft-multi beside them, here Debian's
// real program) and liken's link directory, and resolves the six names through the PATH k3s
// builds. With liken's links first they reach xtables-nft-multi, which runs as iptables in
// nf_tables mode by its argv[0]; without them, or with --prefer-bundled-bin, they reach the
// script.
func TestIptablesThroughK3sPATH(t *testing.T) {
	xtables, err := exec.LookPath("xtables-nft-multi")
	if err != nil {
		xtables = "/usr/sbin/xtables-nft-multi"
	}
	if _, err := os.Stat(xtables); err != nil {
		t.Fatalf("Debian's iptables package (hack/deps.sh installs it): %v", err)
	}
	root := t.TempDir()
	dataDir := filepath.Join(root, "var/lib/rancher/k3s")
	const hash = "0123abcd"
	aux := filepath.Join(dataDir, "data", hash, "bin", "aux")
	must(t, os.MkdirAll(aux, 0o755))
	must(t, os.MkdirAll(filepath.Join(dataDir, "data", "cni"), 0o755))
	b, err := os.ReadFile(xtables)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(aux, "xtables-nft-multi"), b, 0o755))
	must(t, os.WriteFile(filepath.Join(aux, "iptables-detect.sh"), []byte("#!/bin/sh\n# k3s-root's mode detection\n"), 0o755))
	for _, n := range k3s.IptablesNames {
		must(t, os.Symlink("iptables-detect.sh", filepath.Join(aux, n)))
	}
	must(t, os.Symlink(hash, filepath.Join(dataDir, "data", "current")))
	links := filepath.Join(root, strings.TrimPrefix(k3s.IptablesDir, "/"))
	must(t, os.MkdirAll(links, 0o755))
	for name, target := range k3s.IptablesLinks(dataDir) {
		must(t, os.Symlink(target, filepath.Join(links, name)))
	}
	hostPATH := links + ":/usr/bin:/bin"

	for _, tc := range []struct {
		name string
		path string
		ok   bool
	}{
		{"liken's links on the host PATH", k3s.ProcessPATH(dataDir, hash, hostPATH, false), true},
		{"no links", k3s.ProcessPATH(dataDir, hash, "/usr/bin:/bin", false), false},
		{"--prefer-bundled-bin", k3s.ProcessPATH(dataDir, hash, hostPATH, true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Host{PATH: tc.path}.Iptables()
			if tc.ok {
				must(t, err)
				return
			}
			if !errors.Is(err, ErrScript) {
				t.Fatalf("Iptables() = %v, want %v", err, ErrScript)
			}
		})
	}
	// And the program found runs as what it is named, in nf_tables mode.
	path := k3s.ProcessPATH(dataDir, hash, hostPATH, false)
	for _, n := range k3s.IptablesNames {
		p, err := LookPath(n, path)
		must(t, err)
		out, err := exec.Command(p, "--version").CombinedOutput()
		must(t, err)
		if !strings.HasPrefix(string(out), n+" v") || !strings.Contains(string(out), "(nf_tables)") {
			t.Errorf("%s --version through k3s's PATH: %q", n, out)
		}
	}
}

func TestRunStopsAtTheFirstFailure(t *testing.T) {
	var ran []string
	check := func(name string, err error) Check {
		return Check{name, func() error { ran = append(ran, name); return err }}
	}
	var log strings.Builder
	err := Run([]Check{check("a", nil), check("b", errors.New("broken")), check("c", nil)}, &log, "test")
	if err == nil || !strings.Contains(err.Error(), "preflight b: broken") || strings.Join(ran, ",") != "a,b" {
		t.Fatalf("Run = %v, ran %v", err, ran)
	}
	if !strings.Contains(log.String(), "test: preflight: b: FAILED: broken") {
		t.Errorf("log:\n%s", log.String())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
