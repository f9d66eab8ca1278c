package flannel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"liken.dev/liken/internal/atomicfile"
)

// DataDir is where the plugin keeps each container's delegate configuration, for its DEL.
const DataDir = "/var/lib/cni/flannel"

// netConf is the plugin's entry in a CNI network list (k3s's 10-flannel.conflist).
type netConf struct {
	types.NetConf
	SubnetFile string         `json:"subnetFile"`
	DataDir    string         `json:"dataDir"`
	Delegate   map[string]any `json:"delegate"`
}

func parseConf(b []byte) (*netConf, error) {
	c := &netConf{SubnetFile: SubnetFile, DataDir: DataDir}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("reading the flannel plugin's configuration: %w", err)
	}
	return c, nil
}

// delegate is the configuration the plugin hands to its delegate (the bridge plugin unless
// the delegate names another): the node's subnet for host-local's addresses, a route to the
// whole pod network, the MTU flannel chose; the bridge masquerades only when flannel does
// not. What the delegate entry sets itself wins.
func delegate(c *netConf, s Subnet) (map[string]any, error) {
	d := map[string]any{}
	for k, v := range c.Delegate {
		d[k] = v
	}
	set := func(k string, v any) {
		if _, ok := d[k]; !ok {
			d[k] = v
		}
	}
	set("type", "bridge")
	set("name", c.Name)
	set("cniVersion", c.CNIVersion)
	if d["type"] == "bridge" {
		set("isGateway", true)
	}
	set("ipMasq", !s.IPMasq)
	set("mtu", s.MTU)
	if _, ok := d["ipam"]; ok {
		return nil, errors.New("the flannel plugin's delegate may not set ipam: the node's addresses are flannel's subnet")
	}
	d["ipam"] = map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": s.Subnet.Masked().String()}}},
		"routes": []map[string]string{{"dst": s.Network.String()}},
	}
	return d, nil
}

func add(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	s, err := ReadSubnet(c.SubnetFile)
	if err != nil {
		return err
	}
	d, err := delegate(c, s)
	if err != nil {
		return err
	}
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	// Kept before the delegate runs: a DEL after a half-done ADD must find what to undo.
	if err := atomicfile.Write(filepath.Join(c.DataDir, args.ContainerID), b, 0o600); err != nil {
		return err
	}
	r, err := invoke.DelegateAdd(context.Background(), d["type"].(string), b, nil)
	if err != nil {
		return fmt.Errorf("the %s plugin: %w", d["type"], err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return err
	}
	return types.PrintResult(res, c.CNIVersion)
}

// del undoes an ADD by its kept configuration; with none (never added, or deleted already)
// there is nothing to undo, as the CNI specification asks of a DEL.
func del(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	kept := filepath.Join(c.DataDir, args.ContainerID)
	b, err := os.ReadFile(kept)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w", kept, err)
	}
	typ, _ := d["type"].(string)
	if err := invoke.DelegateDel(context.Background(), typ, b, nil); err != nil {
		return fmt.Errorf("the %s plugin: %w", typ, err)
	}
	return os.Remove(kept)
}

func check(args *skel.CmdArgs) error {
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(c.DataDir, args.ContainerID))
	if err != nil {
		return err
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	typ, _ := d["type"].(string)
	return invoke.DelegateCheck(context.Background(), typ, b, nil)
}

// CNIMain runs the plugin when the program runs as flannel (a link of that name in the CNI
// plugins' directory, as k3s links its own plugins to one program); ok is false otherwise.
func CNIMain(argv0 string) (ok bool) {
	if filepath.Base(argv0) != "flannel" {
		return false
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: check}, version.All, "flannel CNI plugin of liken's k3s stand-in")
	return true
}
