package agent

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"liken.dev/liken/internal/coordinator"
)

// TestEveryMetricIsDocumented: docs/metrics.md lists every metric liken-agent serves (its
// own and, on a server, the coordinator's), and nothing else: an operator reads the page,
// not the source. Read from the metrics' descriptions, so a metric with labels counts before
// it has ever been set.
func TestEveryMetricIsDocumented(t *testing.T) {
	m := NewMetrics()
	coordinator.NewMetrics(m.Registry) // as agent.New does on a server
	ch := make(chan *prometheus.Desc)
	go func() { m.Registry.Describe(ch); close(ch) }()
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	var served []string
	for d := range ch {
		if n := name.FindStringSubmatch(d.String()); n != nil {
			served = append(served, n[1])
		} else {
			t.Errorf("a metric's description names no metric: %s", d)
		}
	}
	if len(served) < 10 {
		t.Fatalf("only %d metrics described (%v): the registry was not read", len(served), served)
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	// The tables' first column: | `liken_...` | type | ...
	var documented []string
	for _, row := range regexp.MustCompile("(?m)^\\| `(liken_[a-z0-9_]+)` \\|").FindAllSubmatch(doc, -1) {
		documented = append(documented, string(row[1]))
	}
	sort.Strings(served)
	for _, n := range served {
		if !slices.Contains(documented, n) {
			t.Errorf("metric %s is served but not documented in docs/metrics.md (a row of its tables)", n)
		}
	}
	for _, n := range documented {
		if !slices.Contains(served, n) {
			t.Errorf("docs/metrics.md documents %s, which liken-agent does not serve", n)
		}
	}
}
