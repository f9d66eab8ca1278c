package flannel

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestReadSubnet(t *testing.T) {
	good := "FLANNEL_NETWORK=10.42.0.0/16\nFLANNEL_SUBNET=10.42.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	for _, tt := range []struct {
		name, file, wantErr string
	}{
		{"flannel's", good, ""},
		{"no MTU", strings.Replace(good, "FLANNEL_MTU=1450\n", "", 1), "no FLANNEL_MTU"},
		{"bad subnet", strings.Replace(good, "10.42.1.1/24", "10.42.1.1", 1), "FLANNEL_SUBNET"},
		{"bad masquerade", strings.Replace(good, "IPMASQ=true", "IPMASQ=yes", 1), "FLANNEL_IPMASQ"},
		{"subnet outside the network", strings.Replace(good, "10.42.1.1/24", "10.43.1.1/24", 1), "not inside the network"},
		{"subnet wider than the network", strings.Replace(good, "10.42.1.1/24", "10.42.1.1/8", 1), "not inside the network"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "subnet.env")
			os.WriteFile(p, []byte(tt.file), 0o644)
			s, err := ReadSubnet(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			want := Subnet{Network: netip.MustParsePrefix("10.42.0.0/16"), Subnet: netip.MustParsePrefix("10.42.1.1/24"), MTU: 1450, IPMasq: true}
			if err != nil || s != want {
				t.Fatalf("read %+v, %v; want %+v", s, err, want)
			}
			// Written back, the same file.
			q := filepath.Join(t.TempDir(), "run", "flannel", "subnet.env")
			if err := s.Write(q); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(q); string(b) != good {
				t.Errorf("written %q, want %q", b, good)
			}
		})
	}
	if _, err := ReadSubnet(filepath.Join(t.TempDir(), "none")); err == nil || !strings.Contains(err.Error(), "flannel has not set up") {
		t.Errorf("a missing file: %v", err)
	}
}

func TestDelegate(t *testing.T) {
	s := Subnet{Network: netip.MustParsePrefix("10.42.0.0/16"), Subnet: netip.MustParsePrefix("10.42.1.1/24"), MTU: 1450, IPMasq: true}
	ipam := map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": "10.42.1.0/24"}}},
		"routes": []map[string]string{{"dst": "10.42.0.0/16"}},
	}
	conf := func(d map[string]any) *netConf {
		return &netConf{NetConf: types.NetConf{Name: "cbr0", CNIVersion: "1.0.0", Type: "flannel"}, Delegate: d}
	}
	for _, tt := range []struct {
		name    string
		conf    *netConf
		subnet  Subnet
		want    map[string]any
		wantErr string
	}{
		{name: "k3s's delegate", conf: conf(map[string]any{"hairpinMode": true, "forceAddress": true, "isDefaultGateway": true}), subnet: s,
			want: map[string]any{"type": "bridge", "name": "cbr0", "cniVersion": "1.0.0", "isGateway": true, "ipMasq": false, "mtu": 1450,
				"hairpinMode": true, "forceAddress": true, "isDefaultGateway": true, "ipam": ipam}},
		{name: "flannel not masquerading", conf: conf(nil), subnet: Subnet{Network: s.Network, Subnet: s.Subnet, MTU: 1400},
			want: map[string]any{"type": "bridge", "name": "cbr0", "cniVersion": "1.0.0", "isGateway": true, "ipMasq": true, "mtu": 1400, "ipam": ipam}},
		{name: "the delegate's own values win", conf: conf(map[string]any{"mtu": 1300, "ipMasq": true, "isGateway": false}), subnet: s,
			want: map[string]any{"type": "bridge", "name": "cbr0", "cniVersion": "1.0.0", "isGateway": false, "ipMasq": true, "mtu": 1300, "ipam": ipam}},
		{name: "another delegate", conf: conf(map[string]any{"type": "ipvlan"}), subnet: s,
			want: map[string]any{"type": "ipvlan", "name": "cbr0", "cniVersion": "1.0.0", "ipMasq": false, "mtu": 1450, "ipam": ipam}},
		{name: "ipam of its own", conf: conf(map[string]any{"ipam": map[string]any{"type": "dhcp"}}), subnet: s, wantErr: "may not set ipam"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := delegate(tt.conf, tt.subnet)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("delegate %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}

func TestParseConfDefaults(t *testing.T) {
	c, err := parseConf([]byte(`{"name":"cbr0","cniVersion":"1.0.0","type":"flannel","delegate":{"hairpinMode":true}}`))
	if err != nil || c.SubnetFile != SubnetFile || c.DataDir != DataDir || c.Delegate["hairpinMode"] != true {
		t.Errorf("parsed %+v, %v", c, err)
	}
	if _, err := parseConf([]byte(`{"name":`)); err == nil {
		t.Error("a torn configuration was taken")
	}
}
