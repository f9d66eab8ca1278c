package release

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"

	"liken.dev/liken/internal/kmod"
)

// kernelOption is a kernel configuration option k3s needs, and the module that provides it
// when the kernel builds it as one.
type kernelOption struct {
	name   string // without CONFIG_
	module string // "" when it can only be built in
	why    string
}

// kernelNeeds are the options k3s's check-config.sh (contrib/util) calls generally
// necessary, and those the features liken's API can turn on need: flannel's vxlan and
// wireguard-native backends, network policy (ipset), IPVS, containerd's overlayfs.
// IP_NF_TARGET_MASQUERADE has no module of its own in current kernels: it builds
// xt_MASQUERADE.
var kernelNeeds = func() []kernelOption {
	var out []kernelOption
	for _, n := range []string{"NAMESPACES", "NET_NS", "PID_NS", "IPC_NS", "UTS_NS", "CGROUPS", "CGROUP_CPUACCT",
		"CGROUP_DEVICE", "CGROUP_FREEZER", "CGROUP_SCHED", "CPUSETS", "MEMCG", "KEYS", "POSIX_MQUEUE", "CGROUP_PIDS"} {
		out = append(out, kernelOption{n, "", "k3s check-config.sh"})
	}
	for _, o := range [][2]string{
		{"VETH", "veth"}, {"BRIDGE", "bridge"}, {"BRIDGE_NETFILTER", "br_netfilter"}, {"IP_NF_FILTER", "iptable_filter"},
		{"IP_NF_TARGET_MASQUERADE", "xt_MASQUERADE"}, {"NETFILTER_XT_MATCH_ADDRTYPE", "xt_addrtype"},
		{"NETFILTER_XT_MATCH_CONNTRACK", "xt_conntrack"}, {"NETFILTER_XT_MATCH_IPVS", "xt_ipvs"},
		{"IP_NF_NAT", "iptable_nat"}, {"NF_NAT", "nf_nat"},
	} {
		out = append(out, kernelOption{o[0], o[1], "k3s check-config.sh"})
	}
	for _, o := range [][3]string{
		{"OVERLAY_FS", "overlay", "containerd's overlayfs snapshotter"},
		{"VXLAN", "vxlan", "flannel's vxlan backend (the default)"},
		{"WIREGUARD", "wireguard", "flannel's wireguard-native backend"},
		{"IP_SET", "ip_set", "k3s's network policy controller"},
		{"NETFILTER_XT_SET", "xt_set", "k3s's network policy controller"},
		{"IP_VS", "ip_vs", "kube-proxy's IPVS mode"},
	} {
		out = append(out, kernelOption{o[0], o[1], o[2]})
	}
	return out
}()

// checkKernelConfig reads a kernel's configuration and fails, naming the option, unless
// each option in kernelNeeds is built in or built as a module the image carries (modules:
// the image's module files).
func checkKernelConfig(configPath string, modules []string) error {
	f, err := os.Open(configPath)
	if err != nil {
		return fmt.Errorf("reading the kernel's configuration: %w", err)
	}
	defer f.Close()
	set := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			set[strings.TrimPrefix(k, "CONFIG_")] = v
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the kernel's configuration: %w", err)
	}
	have := map[string]bool{}
	for _, m := range modules {
		have[kmod.Name(m)] = true
	}
	var bad []string
	for _, o := range kernelNeeds {
		switch v := set[o.name]; {
		case v == "y":
		case v == "m" && o.module != "" && have[kmod.Name(o.module)]:
		case v == "m" && o.module != "":
			bad = append(bad, fmt.Sprintf("CONFIG_%s=m but module %s is not in the image (%s)", o.name, o.module, o.why))
		case v == "m":
			bad = append(bad, fmt.Sprintf("CONFIG_%s=m, but it must be built in (%s)", o.name, o.why))
		default:
			bad = append(bad, fmt.Sprintf("CONFIG_%s is not set (%s)", o.name, o.why))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return fmt.Errorf("the kernel cannot run k3s: %s", strings.Join(bad, "; "))
	}
	return nil
}
