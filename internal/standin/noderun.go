package standin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/standin/flannel"
)

// NodeInput is what a stand-in node runs with.
type NodeInput struct {
	// Parts holds the programs: the kube-parts links (containerd, ctr, kubelet, kube-proxy),
	// containerd-shim-runc-v2, runc, and the CNI plugins under cni/.
	Parts string
	// Kubeconfig is the node's identity (system:node:NAME); the components' credentials are
	// beside it (api/release's StandIn* files).
	Kubeconfig string
	// Hash names the unpacked data directory (data/<hash>/bin), where the programs containerd
	// and the kubelet find through PATH are linked.
	Hash string
	// APIServer, when set, is the URL the components' kubeconfigs are given instead of their
	// own (an agent's load balancer, loadbalancer.go).
	APIServer string
	Log       io.Writer
}

// withServer is a kubeconfig with every cluster's server set to url.
func withServer(kubeconfig []byte, url string) ([]byte, error) {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		c.Server = url
	}
	return clientcmd.Write(*cfg)
}

// nodeFiles writes the agent's files as k3s's agent writes them before it starts anything
// (pkg/agent/config, pkg/agent/containerd, pkg/daemons/agent, pkg/agent/flannel): containerd's
// config, the kubelet's drop-in, the components' kubeconfigs and the kubelet's client CA,
// flannel's CNI network list and net-conf.json, and the data directory's program links.
func (n *Node) nodeFiles(in NodeInput) error {
	n.defaults()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	kubelet, err := n.KubeletConfig()
	if err != nil {
		return err
	}
	netConf, err := n.FlannelNetConf()
	if err != nil {
		return err
	}
	files := map[string][]byte{
		n.agent("etc", "containerd", "config.toml"):              n.ContainerdConfig(),
		n.agent("etc", "kubelet.conf.d", "00-k3s-defaults.conf"): kubelet,
		n.agent("etc", "cni", "net.d", "10-flannel.conflist"):    n.FlannelCNIConfig(),
		n.agent("etc", "flannel", "net-conf.json"):               netConf,
	}
	credDir := filepath.Dir(in.Kubeconfig)
	for dst, src := range map[string]string{
		n.agent("kubelet.kubeconfig"):       in.Kubeconfig,
		n.agent("kubeproxy.kubeconfig"):     filepath.Join(credDir, apirelease.StandInKubeProxyKubeconfig),
		n.agent("k3scontroller.kubeconfig"): filepath.Join(credDir, apirelease.StandInControllerKubeconfig),
		n.agent("client-ca.crt"):            filepath.Join(credDir, apirelease.StandInClientCA),
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("the node's credentials (liken layer --stand-in-node-credentials): %w", err)
		}
		if strings.HasSuffix(dst, ".kubeconfig") && in.APIServer != "" {
			if b, err = withServer(b, in.APIServer); err != nil {
				return fmt.Errorf("%s: %w", src, err)
			}
		}
		files[dst] = b
	}
	hosts, ignored, err := RegistryHosts(n.Registries)
	if err != nil {
		return err
	}
	for _, m := range ignored {
		fmt.Fprintf(in.Log, "k3s-standin: mirror %s: its rewrites are left out: they need k3s's own containerd, and the stand-in runs upstream's\n", m)
	}
	// As k3s: the registries file is rendered whole at every start, nothing kept from before.
	certs := n.agent("etc", "containerd", "certs.d")
	if err := os.RemoveAll(certs); err != nil {
		return err
	}
	for dir, data := range hosts {
		files[filepath.Join(certs, dir, "hosts.toml")] = data
	}
	for path, data := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(path, ".kubeconfig") {
			mode = 0o600
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := atomicfile.Write(path, data, mode); err != nil {
			return err
		}
	}
	for _, d := range []string{n.agent("pod-manifests"), n.agent("images")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The programs k3s bundles in data/<hash>/bin, and the CNI plugins also under data/cni
	// (cmd/k3s/main.go extract): upstream's from Parts, flannel's the stand-in itself.
	bin := filepath.Join(n.DataDir, "data", in.Hash, "bin")
	links := map[string]string{"flannel": self}
	for _, p := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		links[p] = filepath.Join(in.Parts, p)
	}
	plugins, err := os.ReadDir(filepath.Join(in.Parts, "cni"))
	if err != nil {
		return fmt.Errorf("the CNI plugins: %w", err)
	}
	cni := []string{"flannel"}
	for _, p := range plugins {
		links[p.Name()] = filepath.Join(in.Parts, "cni", p.Name())
		cni = append(cni, p.Name())
	}
	for name, target := range links {
		if err := os.MkdirAll(bin, 0o755); err != nil {
			return err
		}
		if err := atomicfile.Symlink(target, filepath.Join(bin, name)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(n.DataDir, "data", "cni"), 0o755); err != nil {
		return err
	}
	for _, name := range cni {
		if err := atomicfile.Symlink(links[name], filepath.Join(n.DataDir, "data", "cni", name)); err != nil {
			return err
		}
	}
	return nil
}

// RunNode runs the node's half of k3s until ctx ends or a part of it stops: containerd (a
// child, as k3s runs it, killed with the stand-in but not its containers, whose shims live
// on), the images under agent/images imported as k3s imports its air-gap images, then the
// kubelet and kube-proxy (in k3s's own process; children here, killed with it) and flannel
// (in process, as k3s embeds it). It returns why it stopped.
func (n *Node) RunNode(ctx context.Context, in NodeInput) error {
	if err := n.nodeFiles(in); err != nil {
		return fmt.Errorf("laying out the node's files: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan error, 4)
	var stopped []<-chan struct{}
	defer func() {
		cancel()
		for _, s := range stopped {
			<-s
		}
	}()
	// containerd logs where k3s has it log; the kubelet's and kube-proxy's go beside it (in
	// k3s they share k3s's own log).
	logs := map[string]string{"containerd": n.agent("containerd", "containerd.log"),
		"kubelet": n.agent("logs", "kubelet.log"), "kube-proxy": n.agent("logs", "kube-proxy.log")}
	start := func(name string, args ...string) error {
		s, err := spawnPart(ctx, name, filepath.Join(in.Parts, name), args, os.Environ(), logs[name], in.Log, exited)
		if err == nil {
			stopped = append(stopped, s)
		}
		return err
	}
	if err := start("containerd", n.ContainerdArgs()...); err != nil {
		return err
	}
	if err := n.waitContainerd(ctx, exited); err != nil {
		return err
	}
	now, later, err := n.imageArchives()
	if err != nil {
		return err
	}
	ctr := filepath.Join(in.Parts, "ctr")
	if err := n.importImages(ctx, ctr, now, in.Log); err != nil {
		return err
	}
	if err := start("kubelet", n.KubeletArgs()...); err != nil {
		return err
	}
	// The release's other images (cluster DNS) after the kubelet has started: a pod that
	// needs one before it is in waits on the kubelet's pull back-off, while every boot's
	// Node is Ready without waiting for tens of megabytes to be hashed (slow in a VM with no
	// KVM). A failure here is the stand-in's to report, not a reason to stop the node.
	go func() {
		if err := n.importImages(ctx, ctr, later, in.Log); err != nil && ctx.Err() == nil {
			fmt.Fprintf(in.Log, "k3s-standin: %v\n", err)
		}
	}()
	if err := n.waitNodeIP(ctx, exited, in.Log); err != nil {
		return err
	}
	if err := start("kube-proxy", n.KubeProxyArgs()...); err != nil {
		return err
	}
	go func() {
		err := flannel.Run(ctx, flannel.Options{Kubeconfig: n.agent("k3scontroller.kubeconfig"), NetConf: n.agent("etc", "flannel", "net-conf.json"),
			NodeName: n.NodeName, PublicIP: n.NodeIP, Log: in.Log})
		exited <- fmt.Errorf("flannel stopped: %w", err)
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-exited:
		return err
	}
}

// waitContainerd waits for containerd's socket to take connections, as k3s waits for its CRI
// before it starts the kubelet.
func (n *Node) waitContainerd(ctx context.Context, exited <-chan error) error {
	start := time.Now()
	for {
		if c, err := net.Dial("unix", n.ContainerdSocket()); err == nil {
			c.Close()
			return nil
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("containerd did not serve on %s within two minutes", n.ContainerdSocket())
		}
		if err := pause(ctx, exited, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// pause waits d, or returns why the node cannot wait: ctx ended, or a part exited.
func pause(ctx context.Context, exited <-chan error, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-exited:
		return err
	case <-time.After(d):
		return nil
	}
}

// imageArchives lists the image archives a node imports into containerd's k8s.io namespace,
// as k3s imports its air-gap images at start (pkg/agent/containerd; k3s also takes compressed
// tars, the stand-in .tar only): now, every archive in agent/images (the operator's, which
// k3s imports before the kubelet starts) and the release's pause image; later, the release's
// other images.
func (n *Node) imageArchives() (now, later []string, err error) {
	for i, dir := range append([]string{n.agent("images")}, n.ImageDirs...) {
		entries, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			return nil, nil, err
		}
		var names []string
		for _, e := range entries {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".tar") {
				names = append(names, e.Name())
			}
		}
		sort.Strings(names)
		for _, name := range names {
			if i == 0 || name == apirelease.StandInPauseArchive {
				now = append(now, filepath.Join(dir, name))
			} else {
				later = append(later, filepath.Join(dir, name))
			}
		}
	}
	if len(now) == 0 {
		return nil, nil, errors.New("no image archives in " + n.agent("images") + ": the node cannot run a pod without its pause image")
	}
	return now, later, nil
}

// importImages imports archives into containerd's k8s.io namespace, one after the other: the
// operator's (agent/images) every time, as k3s does, and the release's unless imported
// already as they are (imports.go).
func (n *Node) importImages(ctx context.Context, ctr string, archives []string, log io.Writer) error {
	for _, a := range archives {
		start := time.Now()
		release := filepath.Dir(a) != n.agent("images")
		var rec importRecord
		if release {
			importsMu.Lock()
			recs := n.readImports()
			importsMu.Unlock()
			done, r, err := n.alreadyImported(ctx, ctr, a, recs)
			if err != nil {
				return fmt.Errorf("importing %s: %w", a, err)
			}
			if done {
				fmt.Fprintf(log, "k3s-standin: %s imported already, its images %v in containerd (checked in %s)\n", a, r.Images, time.Since(start).Round(time.Millisecond))
				continue
			}
			rec = r
		}
		out, err := exec.CommandContext(ctx, ctr, "--address", n.ContainerdSocket(), "-n", "k8s.io", "images", "import", a).CombinedOutput()
		if err != nil {
			return fmt.Errorf("importing %s: %w: %s", a, err, out)
		}
		fmt.Fprintf(log, "k3s-standin: imported %s in %s: %s\n", a, time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
		if release {
			if err := n.recordImport(a, rec); err != nil {
				// Only costs an import at the next start.
				fmt.Fprintf(log, "k3s-standin: recording the import of %s: %v\n", a, err)
			}
		}
	}
	return nil
}

// nodeIPWait bounds how long kube-proxy's start waits for the kubelet to give the Node its
// new address.
const nodeIPWait = 2 * time.Minute

// waitNodeIP holds kube-proxy back, when the node's address has changed since the Node was
// last written (a network change's trial boot, or the fallback after it), until the kubelet
// has written the new address: upstream kube-proxy takes the Node's addresses when it starts
// and exits when they change (k8s.io/kubernetes pkg/proxy/node.go, OnNodeChange), which k3s,
// running it in its own process, would take as its own exit and be restarted for; a restart
// of the whole control plane under TCG, minutes. So the stand-in starts it once the Node
// agrees, a difference in order only (docs/k3s.md). No Node yet, or no node-ip set: nothing
// to wait for. After nodeIPWait it starts kube-proxy anyway.
func (n *Node) waitNodeIP(ctx context.Context, exited <-chan error, log io.Writer) error {
	if n.NodeIP == "" {
		return nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", n.agent("kubeproxy.kubeconfig"))
	if err != nil {
		return fmt.Errorf("kube-proxy's kubeconfig: %w", err)
	}
	cfg.Timeout = 10 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	start := time.Now()
	said := false
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, n.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil // the kubelet registers it with the address given
		case err == nil:
			ips := nodeHostIPs(node)
			if len(ips) > 0 && ips[0] == n.NodeIP {
				if said {
					fmt.Fprintf(log, "k3s-standin: node %s has its address %s after %s: starting kube-proxy\n", n.NodeName, n.NodeIP, time.Since(start).Round(time.Second))
				}
				return nil
			}
			if !said {
				said = true
				fmt.Fprintf(log, "k3s-standin: node %s is at %v, its node-ip now %s: kube-proxy starts once the kubelet has written the new address (it exits when a Node's addresses change)\n", n.NodeName, ips, n.NodeIP)
			}
		}
		if time.Since(start) > nodeIPWait {
			fmt.Fprintf(log, "k3s-standin: node %s does not have its address %s after %s: starting kube-proxy anyway\n", n.NodeName, n.NodeIP, nodeIPWait)
			return nil
		}
		if err := pause(ctx, exited, 2*time.Second); err != nil {
			return err
		}
	}
}

// nodeHostIPs are the Node's addresses as kube-proxy takes its first: the InternalIPs, or the
// ExternalIPs when it has none (component-helpers' GetNodeHostIPs).
func nodeHostIPs(node *corev1.Node) []string {
	var internal, external []string
	for _, a := range node.Status.Addresses {
		switch a.Type {
		case corev1.NodeInternalIP:
			internal = append(internal, a.Address)
		case corev1.NodeExternalIP:
			external = append(external, a.Address)
		}
	}
	if len(internal) > 0 {
		return internal
	}
	return external
}
