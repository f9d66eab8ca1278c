package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/api/v1alpha1"
)

// makeRelease writes a release directory with one file and returns it.
func makeRelease(t *testing.T, version, content string) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rootfs.squashfs"), []byte(content), 0o644)
	sum := sha256.Sum256([]byte(content))
	d := apirelease.Document{Schema: apirelease.Schema, Version: version, Created: time.Unix(1785000000, 0).UTC(),
		Files: []apirelease.File{{Name: "rootfs.squashfs", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:]), Role: apirelease.RoleRootfs}}}
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, apirelease.DocumentName), b, 0o644)
	return dir
}

// TestTestReleaseIsNotPinnedByAccident: a release built for tests (release.json test: true)
// is refused by 'release pin' unless --allow-test-release, and the Cluster file is left as
// it was.
func TestTestReleaseIsNotPinnedByAccident(t *testing.T) {
	channel := t.TempDir()
	rel := makeRelease(t, "2026.08.05-001", "faults inside")
	doc := filepath.Join(rel, apirelease.DocumentName)
	b, _ := os.ReadFile(doc)
	var d apirelease.Document
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	d.Test = true
	b, _ = d.Marshal()
	os.WriteFile(doc, b, 0o644)
	if code, _, errOut := run(t, "release", "publish", "--channel", channel, rel); code != exitOK {
		t.Fatal(errOut)
	}
	cluster := filepath.Join(t.TempDir(), "cluster.yaml")
	ex, _ := os.ReadFile(filepath.Join("..", "..", "docs", "examples", "cluster.yaml"))
	os.WriteFile(cluster, ex, 0o644)
	code, _, errOut := run(t, "release", "pin", "--channel", "file://"+channel, "--version", "2026.08.05-001", "--cluster", cluster, "--insecure-unsigned")
	if code != exitFailed || !strings.Contains(errOut, "built for tests") || !strings.Contains(errOut, "--allow-test-release") {
		t.Errorf("pin of a test release: %d %s", code, errOut)
	}
	if after, _ := os.ReadFile(cluster); string(after) != string(ex) {
		t.Error("the refused pin changed the Cluster file")
	}
	code, out, errOut := run(t, "release", "pin", "--channel", "file://"+channel, "--version", "2026.08.05-001", "--cluster", cluster, "--allow-test-release", "--insecure-unsigned")
	if code != exitOK || !strings.Contains(out, "pinned 2026.08.05-001") || !strings.Contains(errOut, "warning: release 2026.08.05-001 was built for tests") {
		t.Errorf("pin --allow-test-release: %d %s %s", code, out, errOut)
	}
}

func TestReleasePublishPinVerify(t *testing.T) {
	channel := t.TempDir()
	rel := makeRelease(t, "2026.08.01-001", strings.Repeat("liken", 1000))
	code, out, errOut := run(t, "release", "publish", "--channel", channel, rel, "-o", "json")
	var pub releaseResult
	if code != exitOK || json.Unmarshal([]byte(out), &pub) != nil || !strings.HasPrefix(pub.Digest, "sha256:") ||
		pub.Version != "2026.08.01-001" || pub.Path != filepath.Join(channel, "2026.08.01-001") {
		t.Fatalf("publish: %d %s %s", code, out, errOut)
	}
	digest := pub.Digest
	// Publishing the same release again changes nothing; a different one of that version is refused.
	if code, _, errOut := run(t, "release", "publish", "--channel", channel, rel); code != exitOK {
		t.Errorf("re-publishing the same release: %s", errOut)
	}
	other := makeRelease(t, "2026.08.01-001", "different")
	if code, _, errOut := run(t, "release", "publish", "--channel", channel, other); code != exitFailed || !strings.Contains(errOut, "never changes") {
		t.Errorf("publishing a different release under a published version: %d %s", code, errOut)
	}
	var idx apirelease.Index
	b, _ := os.ReadFile(filepath.Join(channel, apirelease.IndexName))
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Releases) != 1 || idx.Releases[0].Digest != digest {
		t.Errorf("index = %+v, %v", idx, err)
	}

	srv := httptest.NewServer(http.FileServer(http.Dir(channel)))
	defer srv.Close()
	cluster := filepath.Join(t.TempDir(), "cluster.yaml")
	ex, _ := os.ReadFile(filepath.Join("..", "..", "docs", "examples", "cluster.yaml"))
	os.WriteFile(cluster, ex, 0o644)
	for _, url := range []string{"file://" + channel, srv.URL} {
		code, out, errOut := run(t, "release", "pin", "--channel", url, "--version", "2026.08.01-001", "--cluster", cluster, "--insecure-unsigned")
		if code != exitOK || !strings.Contains(out, "2026.08.01-001 "+digest) {
			t.Fatalf("pin from %s: %d %s %s", url, code, out, errOut)
		}
	}
	if code, out, errOut := run(t, "validate", cluster); code != exitOK {
		t.Errorf("the pinned Cluster no longer validates: %s %s", out, errOut)
	}
	// --set-version pins and makes it the Cluster's spec.version in one checked write.
	code, out, errOut = run(t, "release", "pin", "--channel", "file://"+channel, "--version", "2026.08.01-001", "--cluster", cluster, "--set-version", "--insecure-unsigned")
	if code != exitOK || !strings.Contains(out, "spec.version is 2026.08.01-001") {
		t.Fatalf("pin --set-version: %d %s %s", code, out, errOut)
	}
	code, out, _ = run(t, "validate", cluster, "-o", "json")
	if code != exitOK {
		t.Errorf("the Cluster with its new version no longer validates: %s", out)
	}
	if b, _ := os.ReadFile(cluster); !strings.Contains(string(b), `version: "2026.08.01-001"`) {
		t.Errorf("spec.version not set:\n%s", b)
	}
	code, out, errOut = run(t, "release", "verify", "--channel", srv.URL, "--version", "2026.08.01-001", "--cluster", cluster)
	if code != exitOK || !strings.Contains(out, "every byte matches "+digest) || !strings.Contains(errOut, "100%") {
		t.Errorf("verify: %d %s %s", code, out, errOut)
	}
	// A flipped byte in the channel is caught.
	f := filepath.Join(channel, "2026.08.01-001", "rootfs.squashfs")
	c, _ := os.ReadFile(f)
	c[10] ^= 1
	os.WriteFile(f, c, 0o644)
	code, _, errOut = run(t, "release", "verify", "--channel", srv.URL, "--version", "2026.08.01-001", "--pin", digest)
	if code != exitFailed || !strings.Contains(errOut, "rootfs.squashfs does not match its pin") {
		t.Errorf("verify of a tampered release: %d %s", code, errOut)
	}

}

// TestRetriesAreShown: while a channel answers 503, each retry is printed with its reason.
func TestRetriesAreShown(t *testing.T) {
	channel := t.TempDir()
	rel := makeRelease(t, "2026.08.02-001", "retry me")
	if code, _, errOut := run(t, "release", "publish", "--channel", channel, rel); code != exitOK {
		t.Fatal(errOut)
	}
	var fails atomic.Int32
	files := http.FileServer(http.Dir(channel))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fails.Add(1) <= 2 {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		files.ServeHTTP(w, r)
	}))
	defer srv.Close()
	code, out, errOut := run(t, "release", "pin", "--channel", srv.URL, "--version", "2026.08.02-001", "--insecure-unsigned")
	if code != exitOK || !strings.HasPrefix(out, "2026.08.02-001 sha256:") {
		t.Fatalf("pin through two 503s: exit %d %s %s", code, out, errOut)
	}
	for _, w := range []string{"503", "attempt 2 of 6", "attempt 3 of 6"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errOut)
		}
	}
}

// TestSignedChannelCommands (issue 31): the publisher's path and the operator's, over a real
// HTTP server: keys init prints the root to trust; publish into the signed channel refuses
// to go without keys and signs with them; pin with --trusted-root accepts the signed release
// and refuses a release.json replaced after signing, a root it does not trust, and a
// release copied in unsigned; after a rotation of the targets key the chain is followed;
// pin refuses to go without --trusted-root unless told --insecure-unsigned, and then warns.
func TestSignedChannelCommands(t *testing.T) {
	channel, keys := t.TempDir(), filepath.Join(t.TempDir(), "keys")
	srv := httptest.NewServer(http.FileServer(http.Dir(channel)))
	defer srv.Close()
	t.Setenv("XDG_CACHE_HOME", t.TempDir())

	code, out, errOut := run(t, "release", "keys", "init", "--channel", channel, "--keys", keys, "-o", "json")
	var init keysResult
	if code != exitOK || json.Unmarshal([]byte(out), &init) != nil || !apirelease.ValidDigest(init.RootDigest) {
		t.Fatalf("keys init: exit %d\n%s%s", code, out, errOut)
	}
	root := init.RootDigest
	rel := makeRelease(t, "2026.08.05-001", "signed rootfs")
	if code, _, errOut := run(t, "release", "publish", "--channel", channel, rel); code != exitUsage || !strings.Contains(errOut, "is signed") {
		t.Fatalf("publish without keys into a signed channel: exit %d, want %d: %s", code, exitUsage, errOut)
	}
	if _, err := os.Stat(filepath.Join(channel, "2026.08.05-001")); !os.IsNotExist(err) {
		t.Fatalf("the refused publish copied the release in: %v", err)
	}
	if code, out, errOut := run(t, "release", "publish", "--channel", channel, "--keys", keys, rel); code != exitOK || !strings.Contains(out, "signed 2026.08.05-001") {
		t.Fatalf("signed publish: exit %d\n%s%s", code, out, errOut)
	}
	pin := func(version, trusted string) (int, string, string) {
		args := []string{"release", "pin", "--channel", srv.URL, "--version", version, "-o", "json"}
		if trusted != "" {
			args = append(args, "--trusted-root", trusted)
		} else {
			args = append(args, "--insecure-unsigned")
		}
		return run(t, args...)
	}
	code, out, errOut = pin("2026.08.05-001", root)
	var r releaseResult
	if code != exitOK || json.Unmarshal([]byte(out), &r) != nil || !r.Signed || strings.Contains(errOut, "warning") {
		t.Fatalf("pin of the signed release: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = pin("2026.08.05-001", "")
	if code != exitOK || !strings.Contains(errOut, "WARNING: --insecure-unsigned") {
		t.Errorf("pin with --insecure-unsigned: exit %d, want 0 and a warning: %s", code, errOut)
	}
	if code, _, errOut := run(t, "release", "pin", "--channel", srv.URL, "--version", "2026.08.05-001"); code != exitUsage || !strings.Contains(errOut, "give --trusted-root DIGEST") {
		t.Errorf("pin with neither --trusted-root nor --insecure-unsigned: exit %d, want %d: %s", code, exitUsage, errOut)
	}
	code, _, errOut = pin("2026.08.05-001", "sha256:"+strings.Repeat("2", 64))
	if code == exitOK || !strings.Contains(errOut, "failed the root check") {
		t.Errorf("pin against a root not trusted: exit %d: %s", code, errOut)
	}
	// A release copied into the channel without signing.
	plain := makeRelease(t, "2026.08.06-001", "copied in")
	if err := os.CopyFS(filepath.Join(channel, "2026.08.06-001"), os.DirFS(plain)); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = pin("2026.08.06-001", root)
	if code == exitOK || !strings.Contains(errOut, "failed the target check") {
		t.Errorf("pin of a release not signed: exit %d: %s", code, errOut)
	}
	// release.json replaced after signing (the digest pin would take is the new file's).
	doc := filepath.Join(channel, "2026.08.05-001", apirelease.DocumentName)
	good, _ := os.ReadFile(doc)
	var d apirelease.Document
	if err := json.Unmarshal(good, &d); err != nil {
		t.Fatal(err)
	}
	d.Components.Liken.Version = "evil"
	bad, _ := d.Marshal()
	os.WriteFile(doc, bad, 0o644)
	// Whoever controls the server rewrites the channel's index too.
	index := filepath.Join(channel, apirelease.IndexName)
	ib, _ := os.ReadFile(index)
	os.WriteFile(index, []byte(strings.ReplaceAll(string(ib), apirelease.Digest(good), apirelease.Digest(bad))), 0o644)
	code, _, errOut = pin("2026.08.05-001", root)
	if code == exitOK || !strings.Contains(errOut, "failed the mismatch check") {
		t.Errorf("pin of a replaced release.json: exit %d: %s", code, errOut)
	}
	os.WriteFile(doc, good, 0o644)
	os.WriteFile(index, ib, 0o644)
	// The targets key rotated; the next release signed with the new key is pinned through
	// the new root.
	if code, out, errOut := run(t, "release", "keys", "rotate", "--channel", channel, "--keys", keys, "--role", "targets"); code != exitOK {
		t.Fatalf("rotate: exit %d\n%s%s", code, out, errOut)
	}
	next := makeRelease(t, "2026.08.07-001", "after the rotation")
	if code, out, errOut := run(t, "release", "publish", "--channel", channel, "--keys", keys, next); code != exitOK {
		t.Fatalf("publish after the rotation: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := pin("2026.08.07-001", root); code != exitOK {
		t.Fatalf("pin after the rotation: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "release", "timestamp", "--channel", channel, "--keys", keys); code != exitOK || !strings.Contains(out, "signed the timestamp") {
		t.Fatalf("timestamp: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := pin("2026.08.07-001", root); code != exitOK {
		t.Fatalf("pin after the timestamp: exit %d\n%s%s", code, out, errOut)
	}
}

// TestUpgradePinVerifiesTheChannel (issue 31): with the Cluster naming its channel's root,
// upgrade --pin pins only a release the channel's keys signed; a release copied into the
// channel unsigned is refused, naming the check, and the Cluster is left as it was; with no
// root named (and no explicit insecureUnsignedChannel) nothing is pinned.
func TestUpgradePinVerifiesTheChannel(t *testing.T) {
	lc, kc := adminClient(t)
	ensureCluster(t, lc)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	channel, keys := t.TempDir(), filepath.Join(t.TempDir(), "keys")
	code, out, errOut := run(t, "release", "keys", "init", "--channel", channel, "--keys", keys, "-o", "json")
	var init keysResult
	if code != exitOK || json.Unmarshal([]byte(out), &init) != nil {
		t.Fatalf("keys init: exit %d\n%s%s", code, out, errOut)
	}
	const old, signed, unsigned = "2026.09.01-001", "2026.09.02-001", "2026.09.03-001"
	digests := map[string]string{}
	for _, v := range []string{old, signed} {
		code, out, errOut := run(t, "release", "publish", "--channel", channel, "--keys", keys, "-o", "json", makeRelease(t, v, "rootfs of "+v))
		var r releaseResult
		if code != exitOK || json.Unmarshal([]byte(out), &r) != nil {
			t.Fatalf("publish %s: exit %d\n%s%s", v, code, out, errOut)
		}
		digests[v] = r.Digest
	}
	plain := makeRelease(t, unsigned, "rootfs of "+unsigned)
	if err := os.CopyFS(filepath.Join(channel, unsigned), os.DirFS(plain)); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(plain, apirelease.DocumentName))
	digests[unsigned] = apirelease.Digest(b)

	cl := clusterRestoredAfter(t, lc)
	cl.Spec.Channel, cl.Spec.ChannelRoot, cl.Spec.Version = "file://"+channel, v1alpha1.Digest(init.RootDigest), old
	cl.Spec.Releases = map[string]v1alpha1.Digest{old: v1alpha1.Digest(digests[old])}
	if _, err := lc.UpdateCluster(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "upgrade", unsigned, "--pin", digests[unsigned], "--kubeconfig", kc)
	if code != exitFailed || !strings.Contains(errOut, "failed the target check") {
		t.Errorf("upgrade to a release not signed: exit %d, want %d\n%s%s", code, exitFailed, out, errOut)
	}
	if c, _ := lc.Cluster(t.Context()); c.Spec.Version != old || c.Spec.Releases[unsigned] != "" {
		t.Errorf("the refused upgrade changed the Cluster: version %s, releases %v", c.Spec.Version, c.Spec.Releases)
	}
	code, out, errOut = run(t, "upgrade", signed, "--pin", digests[signed], "--kubeconfig", kc)
	if code != exitOK || strings.Contains(errOut, "unverified") {
		t.Errorf("upgrade to the signed release: exit %d\n%s%s", code, out, errOut)
	}
	if c, _ := lc.Cluster(t.Context()); c.Spec.Version != signed || string(c.Spec.Releases[signed]) != digests[signed] {
		t.Errorf("after the upgrade: version %s, releases %v", c.Spec.Version, c.Spec.Releases)
	}
	// A Cluster that names no root and does not take its channel unsigned pins nothing: its
	// machines would write nothing.
	cl, err := lc.Cluster(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cl.Spec.ChannelRoot = ""
	if _, err := lc.UpdateCluster(t.Context(), cl); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "upgrade", unsigned, "--pin", digests[unsigned], "--kubeconfig", kc)
	if code != exitFailed || !strings.Contains(errOut, "names no channel root") {
		t.Errorf("upgrade --pin with no channel root named: exit %d, want %d\n%s%s", code, exitFailed, out, errOut)
	}
}
