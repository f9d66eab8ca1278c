package k3s

import (
	"path/filepath"
	"strings"
)

// k3s puts iptables in its data directory's bin/aux as links to iptables-detect.sh, a
// /bin/sh script, and liken has no shell. liken's image instead holds IptablesDir, a
// directory of links named as the six iptables programs to the bundle's static
// xtables-nft-multi, which picks the program by its argv[0]. Init puts IptablesDir first in
// the PATH it gives k3s, and k3s puts the host's PATH before bin/aux (without
// --prefer-bundled-bin), so the links are found before the scripts. docs/k3s.md gives the
// sources.
const (
	IptablesDir = "/usr/libexec/liken/iptables"
	// HostPATH is the PATH init gives k3s.
	HostPATH = IptablesDir + ":/usr/bin:/sbin:/bin"
)

// IptablesNames are the programs kube-proxy, flannel and k3s's network policy controller
// find through PATH.
var IptablesNames = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

// IptablesLinks are the image's links: a name to where it points.
func IptablesLinks(dataDir string) map[string]string {
	target := BundledXtables(dataDir)
	links := map[string]string{}
	for _, n := range IptablesNames {
		links[n] = target
	}
	return links
}

// BundledXtables is xtables-nft-multi in the data directory of the k3s that runs: k3s points
// data/current at the directory it unpacked.
func BundledXtables(dataDir string) string {
	return filepath.Join(dataDir, "data", "current", "bin", "aux", "xtables-nft-multi")
}

// ProcessPATH is the PATH k3s gives itself and everything it runs, once it has unpacked its
// data directory dataDir/data/<hash> (cmd/k3s/main.go, stageAndRun): the CNI plugins' and
// its own bin before the host's PATH, bin/aux after it (before it, with
// --prefer-bundled-bin).
func ProcessPATH(dataDir, hash, hostPATH string, preferBundled bool) string {
	data := filepath.Join(dataDir, "data")
	bin := filepath.Join(data, hash, "bin")
	aux := filepath.Join(bin, "aux")
	parts := []string{filepath.Join(data, "cni"), bin}
	if preferBundled {
		parts = append(parts, aux, hostPATH)
	} else {
		parts = append(parts, hostPATH, aux)
	}
	return strings.Join(parts, ":")
}
