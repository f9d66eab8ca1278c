// Command ledger reads `go test -json` on standard input, prints the tests' output as go
// test would without -v (the packages' summaries, and a failed test's lines), and ends with the time ledger: each package's wall time, each VM test's, with
// the boots it made, sorted, and the total. The ten longest entries also go to the figures
// file LIKEN_TEST_REPORT names, so CI prints them. It exits 1 when a test or a package
// failed, so `make test` fails as go test does.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// vmPackage is the VM tier, whose tests are listed one by one.
const vmPackage = "liken.dev/liken/test/vm"

// bootsLine is what the VM tier logs for each machine it stopped (test/vm bootWith): its
// boots and the host CPU time its QEMU used;
// waitLine, how long a VM test waited for a slot (test/vm vmTest), which go test counts in
// its time and the ledger does not.
var (
	bootsLine = regexp.MustCompile(`liken-ledger: boots (\d+)(?: cpu ([0-9.]+)s)?`)
	waitLine  = regexp.MustCompile(`liken-ledger: waited ([0-9.]+)s for a VM slot`)
	// boundLine is a VM test's wait on the API's state that ended well (test/vm waitUntil).
	boundLine = regexp.MustCompile(`liken-ledger: wait "(.*)" took (\S+) of its (\S+)`)
)

// closeCall is a wait that used more than half its bound: the next slower run may fail it.
type closeCall struct {
	test, what  string
	took, bound time.Duration
}

type entry struct {
	name    string
	seconds float64
	boots   int
	cpu     float64 // seconds of host CPU the test's machines used
	failed  bool
	waited  float64
}

type ledger struct {
	closeCalls []closeCall
	packages   map[string]*entry
	tests      map[string]*entry
	failed     bool
	// output holds each running test's lines, printed only if it fails, as go test
	// prints them without -v.
	output map[string]*strings.Builder
	// failures are the failed tests with their last messages, repeated at the end of the
	// figures: CI shows a run's last lines, and a failed VM test's console pushes its
	// message out of them.
	failures []failure
	source   sourceLines
}

// failure is a failed test, the lines its assertions logged, and the last lines it logged
// (t.Errorf, t.Fatalf and t.Logf look alike in go test's output; the source tells them
// apart), the ledger's own lines and a console dump's header aside.
type failure struct {
	test     string
	failures []string
	messages []string
}

// messageLine is the first line of what a test logged: "    file_test.go:123: text".
var messageLine = regexp.MustCompile(`^\s+((\w+_test\.go):(\d+): .*)$`)

// assertion matches a source line that fails a test.
var assertion = regexp.MustCompile(`\b(t|tb|b)\.(Error|Errorf|Fatal|Fatalf)\(`)

// sourceLines reads a test file of a package once; dir is the package's directory.
type sourceLines map[string][]string

func (s sourceLines) get(dir, file string) []string {
	key := filepath.Join(dir, file)
	if lines, ok := s[key]; ok {
		return lines
	}
	b, _ := os.ReadFile(key)
	s[key] = strings.Split(string(b), "\n")
	return s[key]
}

// isAssertion says whether the message at file:line came from a t.Errorf or t.Fatalf:
// go test names the line of the call, which for a call over several lines is its first
// or its last, so the few lines before count too.
func (s sourceLines) isAssertion(dir, file string, line int) bool {
	lines := s.get(dir, file)
	for i := line - 1; i >= 0 && i >= line-4 && i < len(lines); i-- {
		if assertion.MatchString(lines[i]) {
			return true
		}
		if i < line-1 && strings.HasSuffix(strings.TrimSpace(lines[i]), ")") {
			break // the line before ends another statement
		}
	}
	return false
}

// messages are a failed test's assertion lines (the first n) and its last n lines,
// each cut to 300 bytes; dir is the package's directory, where its test files are.
func messages(output, dir string, src sourceLines, n int) (failures, last []string) {
	var msgs []string
	for _, line := range strings.Split(output, "\n") {
		m := messageLine.FindStringSubmatch(line)
		if m == nil || strings.Contains(m[1], "liken-ledger:") || strings.HasSuffix(m[1], "console:") {
			continue
		}
		text := m[1]
		if len(text) > 300 {
			text = text[:300] + "..."
		}
		msgs = append(msgs, text)
		if no, _ := strconv.Atoi(m[3]); len(failures) < n && src.isAssertion(dir, m[2], no) {
			failures = append(failures, text)
		}
	}
	return failures, msgs[max(0, len(msgs)-n):]
}

// packageDir is where a package of this module lives, from the module's root, where
// `make test` runs.
func packageDir(pkg string) string {
	return strings.TrimPrefix(strings.TrimPrefix(pkg, "liken.dev/liken"), "/")
}

func (l *ledger) add(e event, out io.Writer) {
	if e.Test == "" {
		io.WriteString(out, e.Output) // the package's summary, a panic, a build failure
	} else {
		key := e.Package + " " + e.Test
		if l.output[key] == nil {
			l.output[key] = &strings.Builder{}
		}
		l.output[key].WriteString(e.Output)
		switch e.Action {
		case "fail":
			text := l.output[key].String()
			io.WriteString(out, text)
			failures, last := messages(text, packageDir(e.Package), l.source, 3)
			l.failures = append(l.failures, failure{test: e.Test, failures: failures, messages: last})
			delete(l.output, key)
		case "pass", "skip":
			delete(l.output, key)
		}
	}
	switch {
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		l.packages[e.Package] = &entry{name: e.Package, seconds: e.Elapsed, failed: e.Action == "fail"}
		l.failed = l.failed || e.Action == "fail"
	case e.Test != "" && e.Package == vmPackage && !strings.Contains(e.Test, "/"):
		t := l.tests[e.Test]
		if t == nil {
			t = &entry{name: "test/vm " + e.Test}
			l.tests[e.Test] = t
		}
		if m := bootsLine.FindStringSubmatch(e.Output); m != nil {
			n, _ := strconv.Atoi(m[1])
			t.boots += n
			if m[2] != "" {
				cpu, _ := strconv.ParseFloat(m[2], 64)
				t.cpu += cpu
			}
		}
		if m := boundLine.FindStringSubmatch(e.Output); m != nil {
			took, err1 := time.ParseDuration(m[2])
			bound, err2 := time.ParseDuration(m[3])
			if err1 == nil && err2 == nil && bound > 0 && took*2 > bound {
				l.closeCalls = append(l.closeCalls, closeCall{e.Test, m[1], took, bound})
			}
		}
		if m := waitLine.FindStringSubmatch(e.Output); m != nil {
			t.waited, _ = strconv.ParseFloat(m[1], 64)
		}
		if e.Action == "pass" || e.Action == "fail" {
			t.seconds, t.failed = max(0, e.Elapsed-t.waited), e.Action == "fail"
		}
	case e.Test != "" && e.Action == "fail":
		l.failed = true
	}
}

// table is the ledger as text: packages, then VM tests, each sorted longest first, and
// the host's CPU use over the run (cpu, a fraction; negative when unknown).
func (l *ledger) table(total time.Duration, cpu float64) (string, []*entry) {
	var b strings.Builder
	sorted := func(m map[string]*entry) []*entry {
		var out []*entry
		for _, e := range m {
			out = append(out, e)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].seconds != out[j].seconds {
				return out[i].seconds > out[j].seconds
			}
			return out[i].name < out[j].name
		})
		return out
	}
	pkgs, tests := sorted(l.packages), sorted(l.tests)
	fmt.Fprintln(&b, "== time ledger ==")
	fmt.Fprintf(&b, "%-60s %8s\n", "package (wall time, packages run in parallel)", "seconds")
	sum := 0.0
	for _, e := range pkgs {
		sum += e.seconds
		fmt.Fprintf(&b, "%-60s %8.1f%s\n", strings.TrimPrefix(e.name, "liken.dev/liken/"), e.seconds, failedMark(e))
	}
	fmt.Fprintf(&b, "%-60s %8.1f\n", "sum of packages", sum)
	if len(tests) > 0 {
		fmt.Fprintf(&b, "%-60s %8s %6s %8s\n", "VM test (its own time, the wait for a slot aside)", "seconds", "boots", "VM CPU s")
		cpu := 0.0
		for _, e := range tests {
			cpu += e.cpu
			fmt.Fprintf(&b, "%-60s %8.1f %6d %8.0f%s\n", e.name, e.seconds, e.boots, e.cpu, failedMark(e))
		}
		fmt.Fprintf(&b, "%-60s %8s %6s %8.0f\n", "host CPU time of the VM tier's machines", "", "", cpu)
	}
	for _, c := range l.closeCalls {
		fmt.Fprintf(&b, "close call: %s waited %s of its %s for %q\n", c.test, c.took, c.bound, c.what)
	}
	if total > 0 {
		fmt.Fprintf(&b, "%-60s %8.0f\n", "go test wall time", total.Seconds())
	}
	if cpu >= 0 {
		fmt.Fprintf(&b, "%-60s %7.0f%%\n", fmt.Sprintf("host CPU busy over the run (%d cores)", runtime.NumCPU()), 100*cpu)
	}
	all := append(append([]*entry(nil), pkgs...), tests...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].seconds > all[j].seconds })
	return b.String(), all[:min(10, len(all))]
}

func failedMark(e *entry) string {
	if e.failed {
		return "  FAIL"
	}
	return ""
}

// cpuMeter measures how busy the host's CPUs were between its start and busy, from
// /proc/stat: whether the tests left cores idle that more parallel work could use.
type cpuMeter struct{ busy0, all0 uint64 }

func cpuTimes() (busy, all uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:8] { // user nice system idle iowait irq softirq
		n, _ := strconv.ParseUint(v, 10, 64)
		all += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, all, true
}

func startCPUMeter() *cpuMeter {
	busy, all, ok := cpuTimes()
	if !ok {
		return nil
	}
	return &cpuMeter{busy, all}
}

// busy is the fraction of CPU time spent busy since the start, or -1 when unknown.
func (m *cpuMeter) busy() float64 {
	if m == nil {
		return -1
	}
	busy, all, ok := cpuTimes()
	if !ok || all == m.all0 {
		return -1
	}
	return float64(busy-m.busy0) / float64(all-m.all0)
}

func run(in io.Reader, out io.Writer, total func() time.Duration, cpu func() float64) (failed bool, err error) {
	l := &ledger{packages: map[string]*entry{}, tests: map[string]*entry{}, output: map[string]*strings.Builder{}, source: sourceLines{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			// Not JSON: go test's own messages (a build failure), passed through.
			fmt.Fprintln(out, sc.Text())
			continue
		}
		l.add(e, out)
	}
	if err := sc.Err(); err != nil {
		return true, fmt.Errorf("reading go test's output: %w", err)
	}
	text, top := l.table(total(), cpu())
	fmt.Fprint(out, "\n"+text)
	if path := os.Getenv("LIKEN_TEST_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return true, fmt.Errorf("writing the figures: %w", err)
		}
		defer f.Close()
		var names []string
		for _, e := range top {
			s := fmt.Sprintf("%s %.0fs", strings.TrimPrefix(e.name, "liken.dev/liken/"), e.seconds)
			switch {
			case e.boots > 0 && e.cpu > 0:
				s += fmt.Sprintf(" (%d boots, VM CPU %.0fs)", e.boots, e.cpu)
			case e.boots > 0:
				s += fmt.Sprintf(" (%d boots)", e.boots)
			}
			names = append(names, s)
		}
		fmt.Fprintf(f, "time ledger, the ten longest: %s\n", strings.Join(names, "; "))
		for i, fl := range l.failures {
			if i == 10 {
				fmt.Fprintf(f, "failed: %d tests more\n", len(l.failures)-i)
				break
			}
			if len(fl.failures) > 0 {
				fmt.Fprintf(f, "failed: %s; its failed assertions: %s\n", fl.test, strings.Join(fl.failures, " | "))
			}
			fmt.Fprintf(f, "failed: %s; its last lines: %s\n", fl.test, strings.Join(fl.messages, " | "))
		}
	}
	return l.failed, nil
}

func main() {
	start, meter := time.Now(), startCPUMeter()
	failed, err := run(os.Stdin, os.Stdout, func() time.Duration { return time.Since(start) }, meter.busy)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
