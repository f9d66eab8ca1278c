package flannel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/test/apiserver"
)

// TestMain runs the test binary as the plugin when it is run by that name, as the stand-in's
// program is.
func TestMain(m *testing.M) {
	if CNIMain(os.Args[0]) {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPluginInANetworkNamespace: the plugin, run as a container runtime runs it, hands a
// network namespace to upstream's bridge and host-local plugins with flannel's subnet: the
// pod gets an address in the node's subnet, flannel's MTU and routes to the gateway and the
// pod network, the bridge on the host holds the gateway address; DEL takes it all back and a
// second DEL finds nothing to do.
func TestPluginInANetworkNamespace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("network namespaces and a bridge: needs root (CI runs as root)")
	}
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	self, _ := os.Executable()
	if err := os.Symlink(self, filepath.Join(bin, "flannel")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(apiserver.ToolsDir(), "cni", p), filepath.Join(bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// The bridge plugin turns forwarding on for a gateway: the host's setting is put back.
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644) })
	id := fmt.Sprintf("%d", os.Getpid())
	ns, br, network := "liken-flannel-"+id, "lkfl"+id[max(0, len(id)-6):], "liken-flannel-test-"+id
	run("netns", "add", ns)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", ns).Run()
		exec.Command("ip", "link", "del", br).Run()
		os.RemoveAll(filepath.Join("/var/lib/cni/networks", network))
	})

	dir := t.TempDir()
	s := Subnet{Network: netip.MustParsePrefix("10.199.0.0/16"), Subnet: netip.MustParsePrefix("10.199.7.1/24"), MTU: 1400, IPMasq: true}
	if err := s.Write(filepath.Join(dir, "subnet.env")); err != nil {
		t.Fatal(err)
	}
	conf, _ := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": network, "type": "flannel",
		"subnetFile": filepath.Join(dir, "subnet.env"), "dataDir": filepath.Join(dir, "data"),
		"delegate": map[string]any{"bridge": br, "hairpinMode": true, "forceAddress": true, "isDefaultGateway": true},
	})
	plugin := func(command string) ([]byte, error) {
		cmd := exec.Command(filepath.Join(bin, "flannel"))
		cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID=c1", "CNI_NETNS=/run/netns/"+ns,
			"CNI_IFNAME=eth0", "CNI_PATH="+bin)
		cmd.Stdin = bytes.NewReader(conf)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("%s: %v\n%s%s", command, err, out.String(), errOut.String())
		}
		return out.Bytes(), nil
	}

	out, err := plugin("ADD")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		CNIVersion string `json:"cniVersion"`
		IPs        []struct {
			Address string `json:"address"`
			Gateway string `json:"gateway"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil || res.CNIVersion != "1.0.0" || len(res.IPs) != 1 {
		t.Fatalf("ADD's result %s (%v)", out, err)
	}
	addr, err := netip.ParsePrefix(res.IPs[0].Address)
	if err != nil || !netip.MustParsePrefix("10.199.7.0/24").Contains(addr.Addr()) || addr.Bits() != 24 || res.IPs[0].Gateway != "10.199.7.1" {
		t.Fatalf("the pod's address %s, gateway %s: want one in the node's subnet 10.199.7.0/24 behind 10.199.7.1", res.IPs[0].Address, res.IPs[0].Gateway)
	}
	link := run("-n", ns, "addr", "show", "eth0")
	if !strings.Contains(link, "inet "+addr.String()) || !strings.Contains(link, "mtu 1400") {
		t.Errorf("the pod's eth0 lacks %s or flannel's MTU 1400:\n%s", addr, link)
	}
	routes := run("-n", ns, "route")
	if !strings.Contains(routes, "default via 10.199.7.1") || !strings.Contains(routes, "10.199.0.0/16 via 10.199.7.1") {
		t.Errorf("the pod's routes lack the default gateway or the pod network:\n%s", routes)
	}
	if host := run("addr", "show", br); !strings.Contains(host, "inet 10.199.7.1/24") {
		t.Errorf("the bridge %s lacks the gateway address:\n%s", br, host)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "c1")); err != nil {
		t.Errorf("the delegate's configuration was not kept for DEL: %v", err)
	}

	for i := range 2 { // the second DEL finds nothing to undo
		if _, err := plugin("DEL"); err != nil {
			t.Fatalf("DEL %d: %v", i+1, err)
		}
	}
	if out, err := exec.Command("ip", "-n", ns, "link", "show", "eth0").CombinedOutput(); err == nil {
		t.Errorf("eth0 is still in the pod's namespace after DEL:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "c1")); !os.IsNotExist(err) {
		t.Errorf("the kept configuration outlived DEL: %v", err)
	}
	if leases, _ := filepath.Glob(filepath.Join("/var/lib/cni/networks", network, "10.199.*")); len(leases) != 0 {
		t.Errorf("host-local still holds %v after DEL", leases)
	}
}
