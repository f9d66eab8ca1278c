package k3s

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"liken.dev/liken/internal/atomicfile"
)

// Root prefixes every path (a test's temporary directory; "/" on a machine).
type Root string

// Changed reports which rendered files differ from what is on disk.
func (r Root) Changed(out Output) ([]string, error) {
	var changed []string
	for _, p := range out.Paths() {
		old, err := os.ReadFile(r.join(p))
		if err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		if err != nil || string(old) != string(out[p]) {
			changed = append(changed, p)
		}
	}
	return changed, nil
}

// Write replaces the files that changed, each atomically, mode 0600.
func (r Root) Write(out Output) error {
	for _, p := range out.Paths() {
		if _, err := atomicfile.WriteIfChanged(r.join(p), out[p], 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (r Root) join(p string) string {
	return filepath.Join(string(r), strings.TrimPrefix(p, "/"))
}

// KubeletLogsDropIn is the name of liken's drop-in in the kubelet's configuration directory
// (k3s passes --config-dir=DATA/agent/etc/kubelet.conf.d and writes its own
// 00-k3s-defaults.conf there, leaving other files alone: k3s pkg/agent/config/config.go,
// pkg/daemons/agent/agent.go; docs.k3s.io "Kubelet configuration files", from v1.32). The
// stand-in's kubelet reads the same directory.
const KubeletLogsDropIn = "agent/etc/kubelet.conf.d/50-liken-logs.conf"

// KubeletLogsConfig turns on the kubelet's node log query (GET /logs/?query=NAME, which
// without journald reads /var/log/NAME, NAME.log or NAME/NAME.log: k8s.io/kubernetes
// pkg/kubelet/kubelet_server_journal.go), where init keeps liken's and k3s's logs. The
// /logs/ file handler it extends is on by default (enableSystemLogHandler). The feature
// gate NodeLogQuery is beta and off before Kubernetes 1.36 and GA, locked on, from 1.36;
// it is named only for a k3s older than that, as a kubelet refuses a gate it no longer
// knows. k3sVersion is the release's (v1.35.4+k3s1); "" for the stand-in, whose kubelet is
// newer.
func KubeletLogsConfig(k3sVersion string) []byte {
	var b strings.Builder
	b.WriteString("# liken: the kubelet's node log query reads the machine's logs in /var/log (liken logs)\n")
	b.WriteString("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nenableSystemLogHandler: true\nenableSystemLogQuery: true\n")
	if minor, ok := kubeMinor(k3sVersion); ok && minor < 36 {
		b.WriteString("featureGates:\n  NodeLogQuery: true\n")
	}
	return []byte(b.String())
}

// kubeMinor is the Kubernetes minor version of a k3s version such as v1.35.4+k3s1.
func kubeMinor(v string) (int, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "v1.")
	if !ok {
		return 0, false
	}
	minor, _, _ := strings.Cut(rest, ".")
	n, err := strconv.Atoi(minor)
	return n, err == nil
}
