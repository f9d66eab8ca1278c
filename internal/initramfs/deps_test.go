package initramfs

import (
	"os/exec"
	"strings"
	"testing"
)

// TestInitramfsLinksNoAPI: the initramfs's init links none of Kubernetes's or liken's API
// packages. Under emulation every megabyte of the initramfs costs boot time, and one import
// of the API (for a constant) once made it 2.6 MB larger.
func TestInitramfsLinksNoAPI(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "liken.dev/liken/cmd/liken-initramfs").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v %s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "liken.dev/liken/api/") || strings.HasPrefix(p, "sigs.k8s.io/") {
			t.Errorf("the initramfs's init links %s", p)
		}
	}
}
