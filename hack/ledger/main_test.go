package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLedger feeds real `go test -json` lines (as cmd/test2json writes them) and checks the
// table: packages and VM tests sorted longest first, boots and the machines' CPU time summed
// per test, failures
// marked and reported with their assertions found in their source, the ten longest written
// to the figures file.
func TestLedger(t *testing.T) {
	in := `{"Action":"start","Package":"liken.dev/liken/internal/agent"}
{"Action":"output","Package":"liken.dev/liken/internal/agent","Output":"ok  \tliken.dev/liken/internal/agent\t199.9s\n"}
{"Action":"pass","Package":"liken.dev/liken/internal/agent","Elapsed":199.9}
{"Action":"run","Package":"liken.dev/liken/test/vm","Test":"TestA"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestA","Output":"    vm_test.go:1: liken-ledger: boots 3 cpu 120.5s\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestA","Output":"    vm_test.go:1: liken-ledger: boots 2 cpu 30.0s\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestA","Output":"    main_test.go:1: liken-ledger: waited 100.0s for a VM slot\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestA","Output":"    wait_test.go:1: liken-ledger: wait \"vm-1: release A running\" took 3m1s of its 5m0s\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestA","Output":"    wait_test.go:1: liken-ledger: wait \"vm-1: staged\" took 1m0s of its 5m0s\n"}
{"Action":"pass","Package":"liken.dev/liken/test/vm","Test":"TestA","Elapsed":400.5}
{"Action":"run","Package":"liken.dev/liken/test/vm","Test":"TestB"}
{"Action":"run","Package":"liken.dev/liken/test/vm","Test":"TestB/sub"}
{"Action":"pass","Package":"liken.dev/liken/test/vm","Test":"TestB/sub","Elapsed":1}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    vm_test.go:9: the machine never came back\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"        {\"last\": \"Machine\"}\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    vm_test.go:12: fleet: all on B\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    vm_test.go:12: fleet: all Ready\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    vm_test.go:12: fleet: all Idle\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    install_test.go:213: console:\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"        liken-init: a console line\n"}
{"Action":"output","Package":"liken.dev/liken/test/vm","Test":"TestB","Output":"    install_test.go:227: liken-ledger: boots 1 cpu 1.0s\n"}
{"Action":"fail","Package":"liken.dev/liken/test/vm","Test":"TestB","Elapsed":900}
{"Action":"fail","Package":"liken.dev/liken/test/vm","Elapsed":1200.7}
# liken.dev/liken/internal/broken
`
	// The failed test's source, read to tell its assertions from its logs: line 9 is an
	// Errorf over two lines, line 12 a Logf.
	root := t.TempDir()
	src := "package vm\n\n\n\n\n\n\nfunc TestB(t *testing.T) {\n\tt.Errorf(\"the machine %s\",\n\t\t\"never came back\")\n\tfor range 3 {\n\t\tt.Logf(\"fleet: %s\", x)\n\t}\n}\n"
	if err := os.MkdirAll(filepath.Join(root, "test/vm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "test/vm/vm_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	report := filepath.Join(t.TempDir(), "figures")
	t.Setenv("LIKEN_TEST_REPORT", report)
	var out strings.Builder
	failed, err := run(strings.NewReader(in), &out, func() time.Duration { return 1300 * time.Second }, func() float64 { return 0.625 })
	if err != nil || !failed {
		t.Fatalf("failed %v, err %v; want a failure reported", failed, err)
	}
	got := out.String()
	for _, want := range []string{
		"ok  \tliken.dev/liken/internal/agent\t199.9s\n", // the output passed through
		"# liken.dev/liken/internal/broken\n",            // and go test's own lines
		"vm_test.go:9: the machine never came back",      // and a failed test's
		"test/vm  ", "internal/agent  ",
		"sum of packages", "1400.6",
		"test/vm TestB", "900.0      1        1  FAIL",
		"test/vm TestA", "300.5      5      150",
		"host CPU time of the VM tier's machines", "  152\n",
		"go test wall time", "1300",
		"host CPU busy over the run", "62%",
		`close call: TestA waited 3m1s of its 5m0s for "vm-1: release A running"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "test/vm TestB") > strings.Index(got, "test/vm TestA") {
		t.Errorf("VM tests not sorted longest first:\n%s", got)
	}
	if strings.Contains(got, "vm_test.go:1:") {
		t.Errorf("a passing test's lines are printed:\n%s", got)
	}
	if strings.Contains(got, "vm-1: staged") {
		t.Errorf("a wait that used a fifth of its bound is listed as a close call:\n%s", got)
	}
	if strings.Contains(got, "TestB/sub") {
		t.Errorf("a subtest is listed:\n%s", got)
	}
	b, _ := os.ReadFile(report)
	if want := "time ledger, the ten longest: test/vm 1201s; test/vm TestB 900s (1 boots, VM CPU 1s); test/vm TestA 300s (5 boots, VM CPU 150s); internal/agent 200s\n" +
		"failed: TestB; its failed assertions: vm_test.go:9: the machine never came back\n" +
		"failed: TestB; its last lines: vm_test.go:12: fleet: all on B | vm_test.go:12: fleet: all Ready | vm_test.go:12: fleet: all Idle\n"; string(b) != want {
		t.Errorf("figures:\n%q\nwant\n%q", b, want)
	}
}

// TestCPUMeter: the meter reads this host's /proc/stat, and a busy loop shows as busy.
func TestCPUMeter(t *testing.T) {
	m := startCPUMeter()
	if m == nil {
		t.Fatal("no /proc/stat to read")
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	if b := m.busy(); b <= 0 || b > 1 {
		t.Errorf("busy %.3f after a busy loop; want in (0, 1]", b)
	}
}

// TestLedgerPasses: a run with no failure exits 0.
func TestLedgerPasses(t *testing.T) {
	t.Setenv("LIKEN_TEST_REPORT", "")
	in := `{"Action":"pass","Package":"liken.dev/liken/internal/state","Elapsed":0.1}` + "\n"
	var out strings.Builder
	if failed, err := run(strings.NewReader(in), &out, func() time.Duration { return 0 }, func() float64 { return -1 }); failed || err != nil {
		t.Errorf("failed %v, err %v", failed, err)
	}
}
