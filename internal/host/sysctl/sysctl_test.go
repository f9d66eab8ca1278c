package sysctl

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func fakeProc(t *testing.T, values map[string]string) Host {
	t.Helper()
	root := t.TempDir()
	for k, v := range values {
		p := filepath.Join(root, k)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Host{Root: root}
}

func TestApplyAndRestore(t *testing.T) {
	h := fakeProc(t, map[string]string{
		"net/ipv4/ip_forward":             "0",
		"vm/swappiness":                   "60",
		"net/ipv4/tcp_rmem":               "4096\t131072\t6291456",
		"net/ipv4/conf/eth0.20/rp_filter": "1",
	})
	orig := map[string]string{}
	res := h.Apply(map[string]string{
		"net.ipv4.ip_forward":             "1",
		"vm.swappiness":                   "10",
		"net.ipv4.tcp_rmem":               "4096 131072 6291456",
		"net/ipv4/conf/eth0.20/rp_filter": "2",
		"kernel.no_such_key":              "1",
	}, orig)
	if len(res.Set) != 4 {
		t.Errorf("Set = %v, want 4 keys", res.Set)
	}
	if _, ok := res.Failed["kernel.no_such_key"]; !ok || len(res.Failed) != 1 {
		t.Errorf("Failed = %v, want only the unknown key", res.Failed)
	}
	if _, err := os.Stat(filepath.Join(h.Root, "kernel/no_such_key")); err == nil {
		t.Errorf("an unknown key was created as a file")
	}
	for k, want := range map[string]string{"net.ipv4.ip_forward": "1", "vm.swappiness": "10", "net/ipv4/conf/eth0.20/rp_filter": "2"} {
		if got, _ := h.Read(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if orig["vm.swappiness"] != "60" || orig["net.ipv4.ip_forward"] != "0" {
		t.Errorf("originals = %v", orig)
	}

	// A second apply with the same spec keeps the first originals.
	h.Apply(map[string]string{"net.ipv4.ip_forward": "1", "vm.swappiness": "10"}, orig)
	if orig["vm.swappiness"] != "60" {
		t.Errorf("original overwritten by liken's own value: %v", orig)
	}

	// Keys leaving the spec get their originals back.
	res = h.Apply(map[string]string{"vm.swappiness": "10"}, orig)
	if got, _ := h.Read("net.ipv4.ip_forward"); got != "0" {
		t.Errorf("ip_forward after removal = %q, want original 0", got)
	}
	if _, still := orig["net.ipv4.ip_forward"]; still {
		t.Errorf("restored key still remembered")
	}
	if len(res.Restored) < 1 {
		t.Errorf("Restored = %v", res.Restored)
	}
}

func TestPathRefusesEscapes(t *testing.T) {
	h := Host{Root: t.TempDir()}
	for _, k := range []string{"", "../etc/passwd", "/etc/passwd", "net/../../x"} {
		if _, err := h.path(k); err == nil {
			t.Errorf("path(%q) accepted", k)
		}
	}
}

// TestRealKernelInNetworkNamespace writes real net.* sysctls in a network namespace of the
// test's own (they are per namespace), so the host is untouched, and checks removal restores
// the kernel's values. Needs root, as liken's init and agent have.
func TestRealKernelInNetworkNamespace(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread is never unlocked: Go discards it when this goroutine ends, so the
		// namespace dies with it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("creating a network namespace (the host tier runs as root): %v", err)
			return
		}
		h := Default
		before, err := h.Read("net.ipv4.ip_forward")
		if err != nil {
			t.Error(err)
			return
		}
		beforeRmem, _ := h.Read("net.ipv4.tcp_rmem")
		want := "1"
		if before == "1" {
			want = "0"
		}
		orig := map[string]string{}
		res := h.Apply(map[string]string{"net.ipv4.ip_forward": want, "net.ipv4.tcp_rmem": "4096 65536 1048576"}, orig)
		if len(res.Failed) > 0 {
			t.Errorf("apply failed: %v", res.Failed)
			return
		}
		if got, _ := h.Read("net.ipv4.ip_forward"); got != want {
			t.Errorf("kernel ip_forward = %s, want %s", got, want)
		}
		if got, _ := h.Read("net.ipv4.tcp_rmem"); normalize(got) != "4096 65536 1048576" {
			t.Errorf("kernel tcp_rmem = %q", got)
		}
		res = h.Apply(map[string]string{}, orig)
		if len(res.Restored) != 2 || len(res.Failed) > 0 {
			t.Errorf("restore: %+v", res)
		}
		if got, _ := h.Read("net.ipv4.ip_forward"); got != before {
			t.Errorf("ip_forward after removal = %s, want %s", got, before)
		}
		if got, _ := h.Read("net.ipv4.tcp_rmem"); got != beforeRmem {
			t.Errorf("tcp_rmem after removal = %q, want %q", got, beforeRmem)
		}
	}()
	<-done
	// The test process's own namespace was never touched.
	if _, err := Default.Read("net.ipv4.ip_forward"); err != nil {
		t.Fatal(err)
	}
}
