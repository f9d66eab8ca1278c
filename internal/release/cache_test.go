package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
)

// fakeBuild stands in for Build on the host side of the cache's test (a real build takes
// minutes; the VM tier goes through the cache with real builds): it writes a slot image
// made from the source's one file and the version, and a document naming it, and counts
// its calls.
type fakeBuild struct{ calls int }

func (f *fakeBuild) build(opts BuildOptions) (string, *apirelease.Document, error) {
	f.calls++
	src, err := os.ReadFile(filepath.Join(opts.Source, "main.go"))
	if err != nil {
		return "", nil, err
	}
	slot := append([]byte(opts.Version+"\n"), src...)
	if err := os.WriteFile(filepath.Join(opts.Out, SlotImage), slot, 0o644); err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(slot)
	doc := &apirelease.Document{Schema: apirelease.Schema, Version: opts.Version, Created: opts.Epoch.UTC(),
		Files: []apirelease.File{{Name: SlotImage, Size: int64(len(slot)), SHA256: hex.EncodeToString(sum[:]), Role: apirelease.RoleSlot}}}
	raw, err := doc.Marshal()
	if err != nil {
		return "", nil, err
	}
	return apirelease.Digest(raw), doc, os.WriteFile(filepath.Join(opts.Out, apirelease.DocumentName), raw, 0o644)
}

func cacheTestOptions(t *testing.T) BuildOptions {
	t.Helper()
	src := t.TempDir()
	write(t, filepath.Join(src, "go.mod"), "module example\n")
	write(t, filepath.Join(src, "main.go"), "package main\n")
	deb := filepath.Join(t.TempDir(), "linux-image-test_1_amd64.deb")
	write(t, deb, "a kernel package")
	return BuildOptions{Version: "2026.12.02-001", Source: src, KernelDeb: deb, StandIn: true, Epoch: time.Unix(1785000000, 0)}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCacheBuildsOnce: an unchanged tree is not built again, a changed source is, and a
// damaged or unfinished entry is found and built again; what the caller gets is the same
// release either way.
func TestCacheBuildsOnce(t *testing.T) {
	f := &fakeBuild{}
	c := &Cache{Dir: t.TempDir(), build: f.build}
	opts := cacheTestOptions(t)
	var log bytes.Buffer
	opts.Log = &log
	get := func(wantCalls int, wantLog string) (string, string) {
		t.Helper()
		log.Reset()
		opts.Out = t.TempDir()
		before := f.calls
		digest, doc, hit, err := c.BuildCached(opts)
		if err != nil {
			t.Fatal(err)
		}
		if f.calls != wantCalls {
			t.Errorf("%d builds; want %d (log: %s)", f.calls, wantCalls, log.String())
		}
		if hit != (f.calls == before) {
			t.Errorf("BuildCached says hit %v with %d builds before and %d after", hit, before, f.calls)
		}
		if !strings.Contains(log.String(), wantLog) {
			t.Errorf("the log does not say %q:\n%s", wantLog, log.String())
		}
		raw, err := os.ReadFile(filepath.Join(opts.Out, apirelease.DocumentName))
		if err != nil {
			t.Fatal(err)
		}
		if apirelease.Digest(raw) != digest || doc.Version != opts.Version {
			t.Errorf("the release in %s is not the one returned (%s, %s)", opts.Out, digest, doc.Version)
		}
		slot, err := os.ReadFile(filepath.Join(opts.Out, SlotImage))
		if err != nil {
			t.Fatal(err)
		}
		return digest, string(slot)
	}
	first, slot := get(1, "kept in the release cache")
	if again, _ := get(1, "from the release cache"); again != first {
		t.Errorf("a cache hit gave %s; the build gave %s", again, first)
	}

	// A changed source builds again, and so does going back to the first (evicted only
	// beyond Keep entries).
	write(t, filepath.Join(opts.Source, "main.go"), "package main // changed\n")
	if changed, _ := get(2, "kept in the release cache"); changed == first {
		t.Error("a changed source gave the same release")
	}
	write(t, filepath.Join(opts.Source, "main.go"), "package main\n")
	get(2, "from the release cache")

	// A damaged entry is found by its digests, removed and built again.
	key, err := BuildKey(opts)
	if err != nil {
		t.Fatal(err)
	}
	entry := filepath.Join(c.Dir, key)
	b, _ := os.ReadFile(filepath.Join(entry, SlotImage))
	b[0] ^= 0xff
	write(t, filepath.Join(entry, SlotImage), string(b))
	if d, s := get(3, "is damaged"); d != first || s != slot {
		t.Errorf("after rebuilding a damaged entry: %s %q; want %s %q", d, s, first, slot)
	}
	if !strings.Contains(log.String(), "slot.img has SHA-256") {
		t.Errorf("the log does not say which file was damaged:\n%s", log.String())
	}
	get(3, "from the release cache")

	// An entry whose record was never written (a build killed before its end) is built
	// again, and quietly: there was nothing to damage.
	os.Remove(filepath.Join(entry, cacheEntryName))
	get(4, "kept in the release cache")
	// So is one with a file more than its record.
	write(t, filepath.Join(entry, "extra"), "x")
	get(5, "is damaged")
}

// TestCacheFailedBuildKeepsNothing: a build that fails leaves no entry, and the next call
// builds.
func TestCacheFailedBuildKeepsNothing(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	opts := cacheTestOptions(t)
	opts.Out = t.TempDir()
	calls := 0
	c.build = func(o BuildOptions) (string, *apirelease.Document, error) {
		calls++
		os.WriteFile(filepath.Join(o.Out, SlotImage), []byte("half"), 0o644)
		return "", nil, os.ErrDeadlineExceeded
	}
	if _, _, err := c.Build(opts); err == nil {
		t.Fatal("a failed build returned no error")
	}
	ents, _ := os.ReadDir(c.Dir)
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("a failed build left %s in the cache", e.Name())
		}
	}
	c.Build(opts)
	if calls != 2 {
		t.Errorf("%d builds; want 2", calls)
	}
}

// TestCacheKeepsTheLastUsed: beyond Keep entries, those used longest ago go.
func TestCacheKeepsTheLastUsed(t *testing.T) {
	f := &fakeBuild{}
	c := &Cache{Dir: t.TempDir(), Keep: 2, build: f.build}
	opts := cacheTestOptions(t)
	keys := map[string]string{}
	for i, v := range []string{"2026.12.02-001", "2026.12.02-002", "2026.12.02-001", "2026.12.02-003"} {
		opts.Version, opts.Out = v, t.TempDir()
		if _, _, err := c.Build(opts); err != nil {
			t.Fatal(err)
		}
		keys[v], _ = BuildKey(opts)
		// Entries are ordered by when they were last used; make that unambiguous.
		at := time.Now().Add(time.Duration(i-10) * time.Minute)
		os.Chtimes(filepath.Join(c.Dir, keys[v], cacheEntryName), at, at)
	}
	for v, want := range map[string]bool{"2026.12.02-001": true, "2026.12.02-002": false, "2026.12.02-003": true} {
		_, err := os.Stat(filepath.Join(c.Dir, keys[v]))
		if got := err == nil; got != want {
			t.Errorf("%s kept: %v; want %v", v, got, want)
		}
	}
}

// TestBuildKey: every input changes the key; where the release goes and its log do not.
func TestBuildKey(t *testing.T) {
	base := cacheTestOptions(t)
	// A git checkout: tracked and untracked files count, ignored ones do not.
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}} {
		if out, err := exec.Command("git", append([]string{"-C", base.Source}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	write(t, filepath.Join(base.Source, ".gitignore"), "/bin/\n")
	key := func(o BuildOptions) string {
		t.Helper()
		k, err := BuildKey(o)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	want := key(base)
	otherDeb := filepath.Join(t.TempDir(), "linux-image-test_2_amd64.deb")
	write(t, otherDeb, "another kernel package")
	for _, tc := range []struct {
		name   string
		change func(o *BuildOptions)
		same   bool
	}{
		{"version", func(o *BuildOptions) { o.Version = "2026.12.02-002" }, false},
		{"stand-in", func(o *BuildOptions) { o.StandIn = false }, false},
		{"test switches", func(o *BuildOptions) { o.TestSwitches = true }, false},
		{"epoch", func(o *BuildOptions) { o.Epoch = o.Epoch.Add(time.Second) }, false},
		{"kernel package", func(o *BuildOptions) { o.KernelDeb = otherDeb }, false},
		{"k3s version", func(o *BuildOptions) { o.K3sVersion = "v1.34.1+k3s1" }, false},
		{"output and log", func(o *BuildOptions) { o.Out, o.Log = "/elsewhere", os.Stderr }, true},
	} {
		o := base
		tc.change(&o)
		if got := key(o) == want; got != tc.same {
			t.Errorf("%s: same key %v; want %v", tc.name, got, tc.same)
		}
	}
	for _, tc := range []struct {
		name string
		do   func()
		undo func()
		same bool
	}{
		{"a tracked file's content", func() { write(t, filepath.Join(base.Source, "main.go"), "package main // x\n") },
			func() { write(t, filepath.Join(base.Source, "main.go"), "package main\n") }, false},
		{"a tracked file's mode", func() { os.Chmod(filepath.Join(base.Source, "main.go"), 0o755) },
			func() { os.Chmod(filepath.Join(base.Source, "main.go"), 0o644) }, false},
		{"an untracked file", func() { write(t, filepath.Join(base.Source, "new.go"), "package main\n") },
			func() { os.Remove(filepath.Join(base.Source, "new.go")) }, false},
		{"a tracked file deleted", func() {
			os.Rename(filepath.Join(base.Source, "main.go"), filepath.Join(base.Source, "..", "main.go.away"))
		},
			func() {
				os.Rename(filepath.Join(base.Source, "..", "main.go.away"), filepath.Join(base.Source, "main.go"))
			}, false},
		{"an ignored file", func() {
			os.MkdirAll(filepath.Join(base.Source, "bin"), 0o755)
			write(t, filepath.Join(base.Source, "bin", "liken"), "output")
		}, func() { os.RemoveAll(filepath.Join(base.Source, "bin")) }, true},
	} {
		tc.do()
		if got := key(base) == want; got != tc.same {
			t.Errorf("%s: same key %v; want %v", tc.name, got, tc.same)
		}
		tc.undo()
		if key(base) != want {
			t.Fatalf("undoing %s did not give the first key back", tc.name)
		}
	}
}
