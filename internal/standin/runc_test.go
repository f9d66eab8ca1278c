package standin

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/test/apiserver"
)

// TestRuncRunsAContainer: the static runc test/tools builds for the stand-in's node (cgo,
// no seccomp) runs an OCI bundle as containerd's shim will: the program runs as PID 1 of its
// own PID namespace with the bundle's hostname, and nothing is left after delete.
func TestRuncRunsAContainer(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("runs a container: needs root (CI runs as root)")
	}
	if err := apiserver.EnsureTools(t.Context()); err != nil {
		t.Fatal(err)
	}
	runc := filepath.Join(apiserver.ToolsDir(), "runc")
	bundle, state := t.TempDir(), t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	os.MkdirAll(rootfs, 0o755)
	src := filepath.Join(t.TempDir(), "hello.go")
	os.WriteFile(src, []byte(`package main

import (
	"fmt"
	"os"
)

func main() {
	h, _ := os.Hostname()
	fmt.Printf("hello from pid %d on %s\n", os.Getpid(), h)
}
`), 0o644)
	buildStatic(t, filepath.Join(rootfs, "hello"), src)
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v\n%s", err, out)
	}
	var spec map[string]any
	b, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	p := spec["process"].(map[string]any)
	p["terminal"], p["args"] = false, []string{"/hello"}
	spec["hostname"] = "liken-runc-test"
	b, _ = json.Marshal(spec)
	os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644)

	id := fmt.Sprintf("liken-runc-test-%d", os.Getpid())
	out, err := exec.Command(runc, "--root", state, "run", "--bundle", bundle, id).CombinedOutput()
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if want := "hello from pid 1 on liken-runc-test"; !strings.Contains(string(out), want) {
		t.Errorf("the container printed %q, want %q", out, want)
	}
	// run deletes the container once it exits: nothing is left in runc's state.
	if out, err := exec.Command(runc, "--root", state, "list", "-q").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("runc list after the run: %q (%v)", out, err)
	}
}

// buildStatic builds a Go program (a package or a file) with no cgo, so it runs alone in a
// container's root file system.
func buildStatic(t *testing.T, out, what string) {
	t.Helper()
	build := exec.Command("go", "build", "-o", out, what)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", what, err, b)
	}
}
