package standin

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"liken.dev/liken/internal/standin/flannel"
	"liken.dev/liken/internal/standin/image"
	"liken.dev/liken/test/apiserver"
)

// TestContainerdTakesTheConfig: upstream containerd (test/tools) starts from the config and
// command line the node renders as k3s does, and serves the CRI on the socket the kubelet's
// drop-in names: the runtime is ready, and images live in the overlayfs snapshotter.
func TestContainerdTakesTheConfig(t *testing.T) {
	n, conn, _ := startContainerd(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.RuntimeName != "containerd" || !strings.HasPrefix(strings.TrimPrefix(v.RuntimeVersion, "v"), "2.") {
		t.Errorf("the CRI says %s %s, want containerd v2", v.RuntimeName, v.RuntimeVersion)
	}
	st, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range st.Status.Conditions {
		if c.Type == runtimeapi.RuntimeReady && !c.Status {
			t.Errorf("the runtime is not ready: %s %s", c.Reason, c.Message)
		}
	}
	fs, err := runtimeapi.NewImageServiceClient(conn).ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(fs.ImageFilesystems) == 0 || !strings.Contains(fs.ImageFilesystems[0].FsId.Mountpoint, "io.containerd.snapshotter.v1.overlayfs") ||
		!strings.HasPrefix(fs.ImageFilesystems[0].FsId.Mountpoint, filepath.Join(n.DataDir, "agent", "containerd")) {
		t.Errorf("the image file system %v is not the overlayfs snapshotter under the node's containerd root", fs.ImageFilesystems)
	}
}

// startContainerd starts upstream containerd (test/tools) as the node runs it, with the
// node's files in a temporary directory, and returns a connection to its CRI once it answers.
func startContainerd(t *testing.T) (*Node, *grpc.ClientConn, func() string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("runs containerd: needs root (CI runs as root)")
	}
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := &Node{DataDir: filepath.Join(dir, "k3s"), RunDir: filepath.Join(dir, "run"), NodeName: "m1"}
	// A host that may not lower an OOM score (no CAP_SYS_RESOURCE: a build machine's own
	// container) would refuse the sandbox's -998; containerd is told so, as for rootless k3s.
	was, _ := os.ReadFile("/proc/self/oom_score_adj")
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1"), 0); err != nil {
		t.Logf("this host may not lower an OOM score (%v): restrict_oom_score_adj", err)
		n.RestrictOOMScoreAdj = true
	} else {
		os.WriteFile("/proc/self/oom_score_adj", was, 0)
	}
	cfg := filepath.Join(n.DataDir, "agent", "etc", "containerd", "config.toml")
	os.MkdirAll(filepath.Dir(cfg), 0o755)
	if err := os.WriteFile(cfg, n.ContainerdConfig(), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logf, _ := os.Create(logPath)
	cmd := exec.Command(filepath.Join(apiserver.ToolsDir(), "containerd"), n.ContainerdArgs()...)
	cmd.Env = append(os.Environ(), "PATH="+apiserver.ToolsDir()+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
	})
	log := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for {
		if _, err := os.Stat(n.ContainerdSocket()); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("containerd did not make its socket %s within a minute; its log:\n%s", n.ContainerdSocket(), log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+n.ContainerdSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	for {
		if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err == nil {
			return n, conn, log
		} else if ctx.Err() != nil {
			t.Fatalf("the CRI on %s: %v; containerd's log:\n%s", n.ContainerdSocket(), err, log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestContainerdRunsAPod: the pause image built from liken-pause (internal/standin/image),
// imported as k3s imports agent/images, is the sandbox image containerd's config pins: a pod
// sandbox on the host's network runs, a container in it runs through the runc shim and runc
// of test/tools, stops on SIGTERM with exit code 0, and nothing is left once removed.
func TestContainerdRunsAPod(t *testing.T) {
	n, conn, log := startContainerd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	importPause(t, n)
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	sandbox := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: "p1", Uid: "u1", Namespace: "default"},
		LogDirectory: filepath.Join(dir, "logs"),
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	run, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandbox})
	if err != nil {
		t.Fatalf("RunPodSandbox: %v; containerd's log:\n%s", err, log())
	}
	st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: run.PodSandboxId})
	if err != nil || st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("the sandbox: %v (%v)", st, err)
	}
	created, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, SandboxConfig: sandbox,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c1"},
			Image: &runtimeapi.ImageSpec{Image: "docker.io/" + n.PauseImage}, LogPath: "c1.log"}})
	if err != nil {
		t.Fatalf("CreateContainer: %v; containerd's log:\n%s", err, log())
	}
	if _, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		t.Fatalf("StartContainer: %v; containerd's log:\n%s", err, log())
	}
	cs, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: created.ContainerId})
	if err != nil || cs.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the container: %v (%v)", cs, err)
	}
	// Stopped once liken-pause says it stops cleanly, as a kubelet stops a pod long after it
	// started: until the Go runtime has run its main, SIGTERM ends it with code 143.
	logPath := filepath.Join(dir, "logs", "c1.log")
	waitFor(t, 30*time.Second, "liken-pause to say it holds the pod's namespaces", func() (bool, error) {
		b, err := os.ReadFile(logPath)
		return strings.Contains(string(b), "liken-pause: holding the pod's namespaces"), err
	})
	if _, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: created.ContainerId, Timeout: 10}); err != nil {
		t.Fatal(err)
	}
	if cs, err = rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: created.ContainerId}); err != nil ||
		cs.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || cs.Status.ExitCode != 0 {
		t.Errorf("the stopped container: %v (%v); want exited with code 0 (liken-pause ends on SIGTERM)", cs, err)
	}
	for _, step := range []func() error{
		func() error {
			_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: created.ContainerId})
			return err
		},
		func() error {
			_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId})
			return err
		},
		func() error {
			_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId})
			return err
		},
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil || len(l.Items) != 0 {
		t.Errorf("sandboxes left: %v (%v)", l, err)
	}
}

// importPause builds the pause image from liken-pause and imports it into containerd's k8s.io
// namespace with ctr, as k3s imports agent/images.
func importPause(t *testing.T, n *Node) {
	t.Helper()
	archive := pauseArchive(t, n)
	if out, err := exec.Command(filepath.Join(apiserver.ToolsDir(), "ctr"), "--address", n.ContainerdSocket(), "-n", "k8s.io",
		"images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
}

// pauseArchive builds the pause image from liken-pause into an archive, as the release has it.
func pauseArchive(t *testing.T, n *Node) string {
	t.Helper()
	dir := t.TempDir()
	pause := filepath.Join(dir, "pause")
	buildStatic(t, pause, "liken.dev/liken/cmd/liken-pause")
	prog, _ := os.ReadFile(pause)
	archive := filepath.Join(dir, "pause.tar")
	f, _ := os.Create(archive)
	if _, err := image.WriteArchive(f, image.Spec{Ref: "docker.io/" + n.PauseImage, Entrypoint: []string{"/pause"}, User: "65535:65535",
		Files: []image.File{{Path: "/pause", Mode: 0o755, Data: prog}}, Epoch: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return archive
}

// TestReleaseImagesImportedOnce: a release's image archive is imported at the first start and
// not at the next while containerd still holds its image; once the image is gone (pruned), or
// the archive changed, it is imported again. An operator's archive in agent/images is
// imported every time, as k3s does.
func TestReleaseImagesImportedOnce(t *testing.T) {
	n, _, _ := startContainerd(t)
	ctr := filepath.Join(apiserver.ToolsDir(), "ctr")
	archive := pauseArchive(t, n)
	operators := filepath.Join(n.agent("images"), "mine.tar")
	if err := os.MkdirAll(filepath.Dir(operators), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(archive); err != nil || os.WriteFile(operators, b, 0o644) != nil {
		t.Fatal(err)
	}
	imports := func(what string, archives ...string) string {
		t.Helper()
		var log strings.Builder
		if err := n.importImages(t.Context(), ctr, archives, &log); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return log.String()
	}
	if out := imports("first start", archive); !strings.Contains(out, "imported "+archive+" in ") {
		t.Fatalf("first start: %s", out)
	}
	if out := imports("second start", archive, operators); !strings.Contains(out, archive+" imported already, its images [index.docker.io/"+n.PauseImage+"]") ||
		!strings.Contains(out, "imported "+operators+" in ") {
		t.Errorf("second start: %s; want the release's archive skipped, the operator's imported", out)
	}
	if out, err := exec.Command(ctr, "--address", n.ContainerdSocket(), "-n", "k8s.io", "images", "rm", "docker.io/"+n.PauseImage).CombinedOutput(); err != nil {
		t.Fatalf("removing the image: %v: %s", err, out)
	}
	if out := imports("after the image was removed", archive); !strings.Contains(out, "imported "+archive+" in ") {
		t.Errorf("after the image was removed: %s; want it imported again", out)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(archive, later, later); err != nil {
		t.Fatal(err)
	}
	if out := imports("after the archive changed", archive); !strings.Contains(out, "imported "+archive+" in ") {
		t.Errorf("after the archive changed: %s; want it imported again", out)
	}
	if out := imports("once more", archive); !strings.Contains(out, "imported already") {
		t.Errorf("once more: %s; want it skipped", out)
	}
}

// TestPodOnFlannelsNetwork: with k3s's CNI network list in the node's conf_dir, the plugins in
// its bin_dirs (flannel, the stand-in's program, here the test binary; upstream's bridge,
// host-local, loopback, portmap and bandwidth) and flannel's subnet file, a pod sandbox gets
// its own network namespace with an address in the node's subnet, and stopping it gives the
// address back.
func TestPodOnFlannelsNetwork(t *testing.T) {
	n, conn, log := startContainerd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	importPause(t, n)
	dir := t.TempDir()
	s := flannel.Subnet{Network: netip.MustParsePrefix("10.198.0.0/16"), Subnet: netip.MustParsePrefix("10.198.5.1/24"), MTU: 1400, IPMasq: true}
	if err := s.Write(filepath.Join(dir, "subnet.env")); err != nil {
		t.Fatal(err)
	}
	// k3s's list, with the subnet file and the plugin's data where this test keeps them.
	var list map[string]any
	json.Unmarshal(n.FlannelCNIConfig(), &list)
	fl := list["plugins"].([]any)[0].(map[string]any)
	fl["subnetFile"], fl["dataDir"] = filepath.Join(dir, "subnet.env"), filepath.Join(dir, "flannel")
	b, _ := json.Marshal(list)
	confDir, binDir := filepath.Join(n.DataDir, "agent", "etc", "cni", "net.d"), filepath.Join(n.DataDir, "data", "cni")
	os.MkdirAll(confDir, 0o755)
	os.MkdirAll(binDir, 0o755)
	if err := os.WriteFile(filepath.Join(confDir, "10-flannel.conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	os.Symlink(self, filepath.Join(binDir, "flannel"))
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap", "bandwidth"} {
		os.Symlink(filepath.Join(apiserver.ToolsDir(), "cni", p), filepath.Join(binDir, p))
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", "cni0").Run()
		os.RemoveAll("/var/lib/cni/networks/cbr0")
		os.WriteFile("/proc/sys/net/ipv4/ip_forward", fwd, 0o644)
	})

	rt := runtimeapi.NewRuntimeServiceClient(conn)
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "p2", Uid: "u2", Namespace: "default"},
		Hostname: "p2", LogDirectory: filepath.Join(dir, "logs")}
	var run *runtimeapi.RunPodSandboxResponse
	var err error
	// containerd reads the CNI directory when it changes: the first try may find it empty.
	for run == nil {
		if run, err = rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandbox}); err != nil && ctx.Err() != nil {
			t.Fatalf("RunPodSandbox: %v; containerd's log:\n%s", err, log())
		}
		time.Sleep(time.Second)
	}
	st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: run.PodSandboxId})
	if err != nil || st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY || st.Status.Network == nil {
		t.Fatalf("the sandbox: %v (%v)", st, err)
	}
	ip, err := netip.ParseAddr(st.Status.Network.Ip)
	if err != nil || !netip.MustParsePrefix("10.198.5.0/24").Contains(ip) || ip == netip.MustParseAddr("10.198.5.1") {
		t.Fatalf("the pod's address %q: want one of the node's subnet 10.198.5.0/24 other than the gateway", st.Status.Network.Ip)
	}
	if out, _ := exec.Command("ip", "addr", "show", "cni0").CombinedOutput(); !strings.Contains(string(out), "inet 10.198.5.1/24") {
		t.Errorf("the bridge cni0 lacks the gateway address:\n%s", out)
	}
	lease := filepath.Join("/var/lib/cni/networks/cbr0", ip.String())
	if _, err := os.Stat(lease); err != nil {
		t.Errorf("host-local holds no lease for %s: %v", ip, err)
	}
	if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lease); !os.IsNotExist(err) {
		t.Errorf("the pod's address %s is still held after its sandbox stopped: %v", ip, err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
}
