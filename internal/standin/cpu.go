package standin

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The parts' CPU time, on the stand-in's log every cpuEvery: under emulation (the VM tier,
// `liken lab`) what a server's machine costs the host is mostly its control plane and node
// at rest, and this line says which part takes what (docs/testing.md, the time ledger). k3s
// logs no such line: it is the stand-in's own, and says so.

// cpuEvery is how often the stand-in logs its parts' CPU time.
const cpuEvery = 5 * time.Minute

// userHZ is the unit of /proc's CPU times: USER_HZ, 100 on every architecture Linux
// exports it for, whatever the kernel's own tick.
const userHZ = 100

// parts is the CPU ledger of the parts this stand-in started.
var parts = &cpuLedger{running: map[string]int{}, ended: map[string]time.Duration{}}

type cpuLedger struct {
	mu      sync.Mutex
	running map[string]int           // name: pid
	ended   map[string]time.Duration // CPU of each part's runs that ended
}

func (l *cpuLedger) started(name string, pid int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[name] = pid
}

func (l *cpuLedger) exited(name string, ps *os.ProcessState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.running, name)
	if ps != nil {
		l.ended[name] += ps.UserTime() + ps.SystemTime()
	}
}

// byPart is each part's CPU time: its ended runs', and the running one's from /proc (with
// the children it reaped).
func (l *cpuLedger) byPart() map[string]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Duration{}
	for n, d := range l.ended {
		out[n] = d
	}
	for n, pid := range l.running {
		if d, err := procCPU(pid); err == nil {
			out[n] += d
		}
	}
	return out
}

// procCPU is a process's user and system time, and its reaped children's, from
// /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return statCPU(string(b))
}

// statCPU reads utime, stime, cutime and cstime (fields 14 to 17) from a /proc/PID/stat
// line. The command name (field 2) may hold spaces and parentheses: fields are counted
// from its closing one.
func statCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 15 {
		return 0, fmt.Errorf("%d fields after the command name; want 15 or more", len(f))
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("a CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// procOwnCPU is a process's command name and its own user and system time (fields 14 and
// 15, without its reaped children's: every process is counted once).
func procOwnCPU(stat string) (string, time.Duration, error) {
	i, j := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if i < 0 || j < i {
		return "", 0, fmt.Errorf("no command name in %q", stat)
	}
	f := strings.Fields(stat[j+1:])
	if len(f) < 13 {
		return "", 0, fmt.Errorf("%d fields after the command name; want 13 or more", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("a CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return stat[i+1 : j], time.Duration(ticks) * time.Second / userHZ, nil
}

// busiest sums the CPU time of the processes running under procDir by command name (the
// parts' children and the processes the stand-in did not start alike: the agent, the
// containers, their shims) and names the n busiest, most first. Processes that ended are
// not counted: their time is in the kernel's split (machineSplit).
func busiest(procDir string, n int) string {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	by := map[string]time.Duration{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(procDir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // it ended since the directory was read
		}
		if name, d, err := procOwnCPU(string(b)); err == nil && d > 0 {
			by[name] += d
		}
	}
	each := secondsMostFirst(by)
	if len(each) > n {
		each = each[:n]
	}
	return strings.Join(each, ", ")
}

// machineSplit is where the machine's CPUs spent their busy time since boot, in seconds
// (user and nice, system, irq and softirq), from /proc/stat's first line: what the
// processes' own times leave out (the kernel's work for the network, the disks, the
// timers, and processes that ended).
func machineSplit(procStat string) string {
	line, _, _ := strings.Cut(procStat, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return "unknown"
	}
	v := make([]float64, 7)
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return "unknown"
		}
		v[i] = float64(n) / userHZ
	}
	return fmt.Sprintf("user %.0f, system %.0f, irq and softirq %.0f, idle and iowait %.0f", v[0]+v[1], v[2], v[5]+v[6], v[3]+v[4])
}

// machineCPU is the busy and the total time of every CPU, from /proc/stat's first line.
func machineCPU(procStat string) (busy, total int64, err error) {
	line, _, _ := strings.Cut(procStat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("not a /proc/stat cpu line: %q", line)
	}
	for i, s := range f[1:] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		if i >= 8 { // guest and guest_nice are counted in user and nice already
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}

// secondsMostFirst is "NAME SECONDS" for each entry, the most first (then by name).
func secondsMostFirst(by map[string]time.Duration) []string {
	names := make([]string, 0, len(by))
	for k := range by {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if by[names[i]] != by[names[j]] {
			return by[names[i]] > by[names[j]]
		}
		return names[i] < names[j]
	})
	each := make([]string, len(names))
	for i, k := range names {
		each[i] = fmt.Sprintf("%s %.1f", k, by[k].Seconds())
	}
	return each
}

// cpuLine is the line logged: the parts' CPU seconds, most first, and how busy the machine
// was since the last line.
func cpuLine(byPart map[string]time.Duration, self time.Duration, busyPct float64, since time.Duration) string {
	each := secondsMostFirst(byPart)
	busy := "unknown"
	if busyPct >= 0 {
		busy = fmt.Sprintf("%.0f%%", busyPct)
	}
	return fmt.Sprintf("k3s-standin: CPU seconds since start (the stand-in's own ledger, not k3s's): %s; the stand-in itself %.1f; the machine's CPUs %s busy over the last %s",
		strings.Join(each, ", "), self.Seconds(), busy, since.Round(time.Second))
}

// logCPU logs the CPU line every cpuEvery until ctx ends.
func logCPU(ctx context.Context, every time.Duration, log io.Writer) {
	read := func() (int64, int64) {
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			return 0, 0
		}
		busy, total, _ := machineCPU(string(b))
		return busy, total
	}
	busy0, total0 := read()
	last := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		busy, total := read()
		pct := -1.0
		if total > total0 {
			pct = 100 * float64(busy-busy0) / float64(total-total0)
		}
		self, _ := procCPU(os.Getpid())
		fmt.Fprintln(log, cpuLine(parts.byPart(), self, pct, time.Since(last)))
		stat, _ := os.ReadFile("/proc/stat")
		fmt.Fprintf(log, "k3s-standin: the machine's CPU seconds since boot: %s; its busiest running processes by name: %s\n", machineSplit(string(stat)), busiest("/proc", 8))
		busy0, total0, last = busy, total, time.Now()
	}
}
