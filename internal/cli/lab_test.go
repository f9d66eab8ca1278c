package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/lab"
	"liken.dev/liken/test/apiserver"
)

// TestLabPublishFinishesWhatWasCutShort: a publish that built its release but did not pin it
// (CI saw the lab's API server silent for minutes after the build) is finished by the same
// command run again, which publishes and pins the release it built rather than refusing the
// version; once pinned, the version is refused.
func TestLabPublishFinishesWhatWasCutShort(t *testing.T) {
	lc, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ensureCluster(t, lc)
	dir := t.TempDir()
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := apiserver.WriteKubeconfig(kc, env.Admin); err != nil {
		t.Fatal(err)
	}
	// The lab's channel server, as Alive finds it: a process tagged with the lab's directory.
	channel := exec.Command("sleep", "600")
	channel.Env = append(os.Environ(), lab.TagEnv+"="+dir)
	if err := channel.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { channel.Process.Kill(); channel.Wait() })
	st, _ := json.Marshal(lab.State{Dir: dir, Kubeconfig: kc, ChannelPID: channel.Process.Pid, Source: "/nonexistent"})
	if err := os.WriteFile(filepath.Join(dir, lab.StateFile), st, 0o644); err != nil {
		t.Fatal(err)
	}
	// What the cut-short publish left: the release it built, in the lab's release directory.
	const version = "2026.12.01-009"
	rel := filepath.Join(dir, "release", version)
	os.MkdirAll(rel, 0o755)
	kernel := []byte(strings.Repeat("kernel-", 1000))
	sum := sha256.Sum256(kernel)
	doc := apirelease.Document{Schema: apirelease.Schema, Version: version, Created: time.Unix(1785000000, 0).UTC(),
		Files: []apirelease.File{{Name: "vmlinuz", Size: int64(len(kernel)), SHA256: hex.EncodeToString(sum[:]), Role: apirelease.RoleKernel}}}
	raw, _ := json.MarshalIndent(doc, "", "  ")
	os.WriteFile(filepath.Join(rel, "vmlinuz"), kernel, 0o644)
	os.WriteFile(filepath.Join(rel, apirelease.DocumentName), raw, 0o644)

	code, out, errOut := run(t, "lab", "publish", "--dir", dir, "--version", version)
	if code != exitOK || !strings.Contains(errOut+out, "was built before but not pinned") || strings.Contains(errOut+out, "building the stand-in release") {
		t.Fatalf("publish after a cut-short one: exit %d\n%s%s", code, out, errOut)
	}
	c, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := string(c.Spec.Releases[version]); got != apirelease.Digest(raw) {
		t.Errorf("the Cluster pins %s at %q; want %s", version, got, apirelease.Digest(raw))
	}
	if _, err := os.Stat(filepath.Join(dir, "channel", version, apirelease.DocumentName)); err != nil {
		t.Errorf("the release is not in the lab's channel: %v", err)
	}
	code, out, errOut = run(t, "lab", "publish", "--dir", dir, "--version", version)
	if code == exitOK || !strings.Contains(errOut, "already has release "+version+", pinned in the Cluster") {
		t.Errorf("publish of a version already pinned: exit %d\n%s%s", code, out, errOut)
	}
	c, _ = lc.Cluster(t.Context())
	delete(c.Spec.Releases, version)
	if _, err := lc.UpdateCluster(t.Context(), c); err != nil {
		t.Fatal(err)
	}
}
