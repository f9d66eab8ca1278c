package flannel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/flannel-io/flannel/pkg/backend"
	"github.com/flannel-io/flannel/pkg/ip"
	"github.com/flannel-io/flannel/pkg/ipmatch"
	"github.com/flannel-io/flannel/pkg/subnet/kube"
	"github.com/flannel-io/flannel/pkg/trafficmngr/iptables"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	// The vxlan backend, k3s's default and the only one the stand-in offers.
	_ "github.com/flannel-io/flannel/pkg/backend/vxlan"
)

// Options are what k3s's agent gives the flannel it embeds (pkg/agent/flannel).
type Options struct {
	// Kubeconfig can get, list and watch Nodes and patch their status: k3s uses its
	// k3s-controller identity where the kubelet's cannot list Nodes.
	Kubeconfig string
	// NetConf is net-conf.json (agent/etc/flannel/net-conf.json).
	NetConf  string
	NodeName string
	// Iface is flannel-iface; empty, the interface that holds PublicIP, else the default
	// route's interface.
	Iface    string
	PublicIP string // node-ip
	// SubnetFile is where the node's subnet is written for the CNI plugin (SubnetFile).
	SubnetFile string
	Log        io.Writer
	// Ready is called once subnet.env is written and the traffic rules are in place.
	Ready func()
}

// Run is flannel as k3s runs it: it waits for its Node's pod CIDR (kube-controller-manager
// allocates it), takes the kube subnet manager with the vxlan backend (flannel.1), sets up
// the masquerade and forward rules through iptables, writes subnet.env, and keeps the routes,
// neighbours and forwarding entries to the other nodes' subnets until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.SubnetFile == "" {
		o.SubnetFile = SubnetFile
	}
	// flannel's kube subnet manager finds its Node by this variable; k3s sets it too.
	if err := os.Setenv("NODE_NAME", o.NodeName); err != nil {
		return err
	}
	if _, err := os.Stat("/proc/sys/net/bridge/bridge-nf-call-iptables"); err != nil {
		return fmt.Errorf("flannel needs br_netfilter: %w", err)
	}
	cidr, err := waitForPodCIDR(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "k3s-standin: flannel: node %s has pod CIDR %s\n", o.NodeName, cidr)
	sm, err := kube.NewSubnetManager(ctx, "", o.Kubeconfig, "flannel.alpha.coreos.com", o.NetConf, false)
	if err != nil {
		return fmt.Errorf("flannel's kube subnet manager: %w", err)
	}
	config, err := sm.GetNetworkConfig(ctx)
	if err != nil {
		return fmt.Errorf("flannel's network config: %w", err)
	}
	stack, err := ipmatch.GetIPFamily(true, false)
	if err != nil {
		return err
	}
	name := o.Iface
	if name == "" {
		name = o.PublicIP
	}
	ext, err := ipmatch.LookupExtIface(name, "", "", stack, ipmatch.PublicIPOpts{PublicIP: o.PublicIP})
	if err != nil {
		return fmt.Errorf("flannel: finding the interface to the other nodes: %w", err)
	}
	be, err := backend.NewManager(ctx, sm, ext).GetBackend(config.BackendType)
	if err != nil {
		return fmt.Errorf("flannel's %s backend: %w", config.BackendType, err)
	}
	var wg sync.WaitGroup
	bn, err := be.RegisterNetwork(ctx, &wg, config)
	if err != nil {
		return fmt.Errorf("flannel: registering the network: %w", err)
	}
	prev, _ := ReadSubnet(o.SubnetFile) // the rules of a run before are replaced
	tm := &iptables.IPTablesManager{}
	if err := tm.Init(ctx); err != nil {
		return fmt.Errorf("flannel's iptables rules: %w", err)
	}
	// As k3s: masquerade resynced every 60 s, forward rules every 50 s.
	if err := tm.SetupAndEnsureMasqRules(ctx, config.Network, ip4Net(prev.Subnet), ip4Net(prev.Network),
		ip.IP6Net{}, ip.IP6Net{}, ip.IP6Net{}, bn.Lease(), 60, false); err != nil {
		return fmt.Errorf("flannel's masquerade rules: %w", err)
	}
	tm.SetupAndEnsureForwardRules(ctx, config.Network, ip.IP6Net{}, 50)
	// The bridge's gateway is the subnet's first address, as flannel writes FLANNEL_SUBNET.
	sub := bn.Lease().Subnet
	sub.IncrementIP()
	network, err1 := netip.ParsePrefix(config.Network.String())
	gw, err2 := netip.ParsePrefix(sub.String())
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("flannel's lease: %w", err)
	}
	if err := (Subnet{Network: network, Subnet: gw, MTU: bn.MTU(), IPMasq: true}).Write(o.SubnetFile); err != nil {
		return fmt.Errorf("writing %s: %w", o.SubnetFile, err)
	}
	fmt.Fprintf(o.Log, "k3s-standin: flannel: vxlan on %s, subnet %s, MTU %d (%s)\n", ext.Iface.Name, gw, bn.MTU(), o.SubnetFile)
	if o.Ready != nil {
		o.Ready()
	}
	bn.Run(ctx)
	wg.Wait()
	return ctx.Err()
}

func ip4Net(p netip.Prefix) ip.IP4Net {
	if !p.IsValid() {
		return ip.IP4Net{}
	}
	_, n, err := net.ParseCIDR(p.Masked().String())
	if err != nil {
		return ip.IP4Net{}
	}
	return ip.FromIPNet(n)
}

// waitForPodCIDR waits for the Node to be given its pod CIDR, as k3s's flannel setup does.
func waitForPodCIDR(ctx context.Context, o Options) (string, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return "", fmt.Errorf("flannel: reading %s: %w", o.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", err
	}
	said := false
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, o.NodeName, metav1.GetOptions{})
		if err == nil && node.Spec.PodCIDR != "" {
			return node.Spec.PodCIDR, nil
		}
		if !said {
			fmt.Fprintf(o.Log, "k3s-standin: flannel: waiting for node %s's pod CIDR (%v)\n", o.NodeName, err)
			said = true
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
