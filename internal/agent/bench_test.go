package agent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/apiserver"
)

var benchRuns atomic.Int32

// BenchmarkLiveChange measures, against the real API server, the time from a Machine spec
// update (a node label) to the change applied on the Node and reported in status
// (appliedGeneration and ConfigApplied). One iteration is one edit; run with -benchtime=100x.
func BenchmarkLiveChange(b *testing.B) {
	name := fmt.Sprintf("bench-%d", benchRuns.Add(1))
	f := setup(b, map[string]v1alpha1.Role{name: v1alpha1.RoleAgent})
	s := newSim(b, name, v1alpha1.RoleAgent)
	s.boot(b, f)
	s.start(b)
	defer s.stop()
	w, err := f.liken.MachineListWatch(name).Watch(metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	applied := func(gen int64) {
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type != watch.Modified && ev.Type != watch.Added {
					continue
				}
				m := ev.Object.(*v1alpha1.Machine)
				if m.Status.AppliedGeneration >= gen && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineConfigApplied) {
					return
				}
			case <-time.After(30 * time.Second):
				b.Fatalf("generation %d never reported applied", gen)
			}
		}
	}
	m, err := f.liken.Machine(context.Background(), name)
	if err != nil {
		b.Fatal(err)
	}
	applied(m.Generation)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		patch := fmt.Sprintf(`{"spec":{"nodeLabels":{"bench":"%d"}}}`, i)
		start := time.Now()
		m, err = f.liken.PatchMachine(context.Background(), name, []byte(patch))
		if err != nil {
			b.Fatal(err)
		}
		applied(m.Generation)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
	if b.N >= 10 {
		apiserver.Report("agent live change (label edit → applied and in status), %d edits: p50 %.1f ms, p99 %.1f ms", b.N, p(0.5), p(0.99))
	}
}

// BenchmarkAgentIdle runs the liken-agent binary as its own process on a settled machine and
// measures its resident memory and the API requests it makes per minute while nothing
// changes (watches excluded: they stay open). Its init socket has no boot control (as on a
// host liken's init did not boot), so the release, trial and reboot machinery is off: the
// figure says so. TestIdleMachinesOnlyWatch checks an idle agent with that machinery on
// (and the coordinator) makes no request but its watches.
func BenchmarkAgentIdle(b *testing.B) {
	name := fmt.Sprintf("idle-%d", benchRuns.Add(1))
	f := setup(b, map[string]v1alpha1.Role{name: v1alpha1.RoleAgent})
	s := newSim(b, name, v1alpha1.RoleAgent)
	s.boot(b, f)
	bin := filepath.Join(b.TempDir(), "liken-agent")
	build := exec.Command("go", "build", "-o", bin, "liken.dev/liken/cmd/liken-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building liken-agent: %v\n%s", err, out)
	}
	cfg, err := env.UserConfig(authority.User(name), authority.Group)
	if err != nil {
		b.Fatal(err)
	}
	kc := filepath.Join(s.dir, "agent.kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, cfg); err != nil {
		b.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	metricsAddr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--machine", name, "--kubeconfig", kc, "--state-dir", filepath.Join(s.dir, "state"),
		"--init-socket", filepath.Join(s.dir, "init.sock"), "--join", "https://s1:6443", "--metrics-addr", metricsAddr,
		"--sysctl-root", s.sysctl.Root, "--k3s-config", s.paths.Config, "--k3s-registries", s.paths.Registries,
		"--k3s-registry-files", s.paths.RegistryFiles, "--k3s-token-file", s.paths.TokenFile, "--k3s-data-dir", s.paths.DataDir,
		"--k3s-healthz", s.healthz)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		m, err := f.liken.Machine(context.Background(), name)
		if err == nil && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the agent process never reported Ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let start-up settle
	window := 30 * time.Second
	before := scrape(b, metricsAddr)
	time.Sleep(window)
	after := scrape(b, metricsAddr)
	rss := rssKiB(b, cmd.Process.Pid)
	var perMin float64
	var detail []string
	for verb, n := range after {
		if verb == "WATCH" {
			continue
		}
		d := n - before[verb]
		perMin += d * float64(time.Minute) / float64(window)
		detail = append(detail, fmt.Sprintf("%s %.0f", verb, d))
	}
	sort.Strings(detail)
	b.ReportMetric(float64(rss)/1024, "rss-MiB")
	b.ReportMetric(perMin, "api-req/min")
	b.ReportMetric(0, "ns/op")
	apiserver.Report("agent idle (own process, without init's boot control: releases, trials and reboots off; %s window): resident memory %.1f MiB, %.1f API requests/min besides watches %v, %.0f watches opened in all",
		window, float64(rss)/1024, perMin, detail, after["WATCH"])
}

func scrape(b *testing.B, addr string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "liken_agent_api_requests_total{") {
			continue
		}
		verb := line[strings.Index(line, `verb="`)+6:]
		verb = verb[:strings.Index(verb, `"`)]
		v, _ := strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
		out[verb] = v
	}
	return out
}

func rssKiB(b *testing.B, pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "VmRSS:" {
			n, _ := strconv.Atoi(fields[1])
			return n
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
