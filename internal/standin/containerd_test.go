package standin

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"liken.dev/liken/test/apiserver"
)

// TestContainerdTakesTheConfig: upstream containerd (test/tools) starts from the config and
// command line the node renders as k3s does, and serves the CRI on the socket the kubelet's
// drop-in names: the runtime is ready, and images live in the overlayfs snapshotter.
func TestContainerdTakesTheConfig(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("runs containerd: needs root (CI runs as root)")
	}
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := &Node{DataDir: filepath.Join(dir, "k3s"), RunDir: filepath.Join(dir, "run"), NodeName: "m1"}
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
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	var v *runtimeapi.VersionResponse
	for v == nil {
		if v, err = rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil && ctx.Err() != nil {
			t.Fatalf("the CRI on %s: %v; containerd's log:\n%s", n.ContainerdSocket(), err, log())
		}
		time.Sleep(100 * time.Millisecond)
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
