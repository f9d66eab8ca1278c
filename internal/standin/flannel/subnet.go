// Package flannel is the k3s stand-in's pod network, as k3s embeds flannel: the CNI plugin
// named flannel that k3s's conflist calls, and (to come, issue 26) the vxlan backend with the
// kube subnet manager. Behaviour and files follow flannel-io/cni-plugin and k3s's
// pkg/agent/flannel as docs/research/k3s-node.md records them; no code of theirs is here.
package flannel

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"liken.dev/liken/internal/atomicfile"
)

// SubnetFile is where flannel writes the node's pod subnet, and its CNI plugin reads it.
const SubnetFile = "/run/flannel/subnet.env"

// Subnet is what subnet.env holds: the cluster's pod network, this node's part of it (as the
// bridge's gateway address: the subnet's first address with its prefix length), the MTU pods
// get, and whether flannel itself masquerades traffic leaving the pod network.
type Subnet struct {
	Network netip.Prefix
	Subnet  netip.Prefix
	MTU     int
	IPMasq  bool
}

// ReadSubnet reads subnet.env, refusing a file that lacks any of its four values.
func ReadSubnet(path string) (Subnet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Subnet{}, fmt.Errorf("reading flannel's subnet file (flannel has not set up this node's pod network yet?): %w", err)
	}
	vals := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			vals[k] = v
		}
	}
	var s Subnet
	for _, f := range []struct {
		key   string
		parse func(string) error
	}{
		{"FLANNEL_NETWORK", func(v string) (err error) { s.Network, err = netip.ParsePrefix(v); return }},
		{"FLANNEL_SUBNET", func(v string) (err error) { s.Subnet, err = netip.ParsePrefix(v); return }},
		{"FLANNEL_MTU", func(v string) (err error) { s.MTU, err = strconv.Atoi(v); return }},
		{"FLANNEL_IPMASQ", func(v string) (err error) { s.IPMasq, err = strconv.ParseBool(v); return }},
	} {
		v, ok := vals[f.key]
		if !ok {
			return Subnet{}, fmt.Errorf("%s: no %s", path, f.key)
		}
		if err := f.parse(v); err != nil {
			return Subnet{}, fmt.Errorf("%s: %s=%q: %w", path, f.key, v, err)
		}
	}
	if !s.Network.Contains(s.Subnet.Addr()) || s.Subnet.Bits() < s.Network.Bits() {
		return Subnet{}, fmt.Errorf("%s: the node's subnet %s is not inside the network %s", path, s.Subnet, s.Network)
	}
	return s, nil
}

// Write writes subnet.env whole or not at all, as flannel does (a temporary file renamed).
func (s Subnet) Write(path string) error {
	b := fmt.Sprintf("FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s\nFLANNEL_MTU=%d\nFLANNEL_IPMASQ=%t\n", s.Network, s.Subnet, s.MTU, s.IPMasq)
	return atomicfile.Write(path, []byte(b), 0o644)
}
