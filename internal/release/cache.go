package release

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	apirelease "liken.dev/liken/api/release"
)

// DefaultCacheKeep is how many releases a Cache keeps: the VM tier and the lab test use
// four per run, so a rerun after a change still finds the last run's.
const DefaultCacheKeep = 8

// cacheEntryName is the file in a cache entry recording what the entry holds. It is
// written last: an entry without it was never finished.
const cacheEntryName = "cache-entry.json"

// Cache keeps built releases, keyed by everything a build reads, so that a rerun of the
// tests (or a second `liken lab up`) does not build the same release again. A build is
// reproducible (the same inputs give the same bytes, TestReleaseBuildReproducible), which
// is what makes reusing one sound; the key therefore holds every input: the options, the
// content of every file of the source tree and its commit, the kernel package, the Go
// toolchain and the host's packages (GRUB, mksquashfs and the mkfs tools come from them).
type Cache struct {
	// Dir holds the entries; empty means no cache (every Build builds).
	Dir string
	// Keep is how many entries are kept, newest used first (0: DefaultCacheKeep).
	Keep int
	// build is Build; the cache's own tests count calls through it.
	build func(BuildOptions) (string, *apirelease.Document, error)
}

// DefaultCache is the cache under the user's cache directory (~/.cache/liken/releases),
// or the directory LIKEN_RELEASE_CACHE names; LIKEN_RELEASE_CACHE=off turns it off.
func DefaultCache() *Cache {
	dir := os.Getenv("LIKEN_RELEASE_CACHE")
	switch dir {
	case "off":
		dir = ""
	case "":
		if c, err := os.UserCacheDir(); err == nil {
			dir = filepath.Join(c, "liken", "releases")
		}
	}
	return &Cache{Dir: dir}
}

type cacheEntry struct {
	Key    string            `json:"key"`
	Digest string            `json:"digest"`
	Built  time.Time         `json:"built"`
	Took   string            `json:"took"`
	Files  map[string]string `json:"files"` // name: SHA-256
}

// Build is Build through the cache: on a hit, the entry's files are checked against the
// digests recorded when it was built as they are copied into opts.Out; an entry that fails
// the check is removed and the release built again. opts.Log says which happened.
func (c *Cache) Build(opts BuildOptions) (string, *apirelease.Document, error) {
	digest, doc, _, err := c.BuildCached(opts)
	return digest, doc, err
}

// BuildCached is Build, and says whether the release came from the cache.
func (c *Cache) BuildCached(opts BuildOptions) (digest string, doc *apirelease.Document, hit bool, err error) {
	build := c.build
	if build == nil {
		build = Build
	}
	if c.Dir == "" {
		digest, doc, err = build(opts)
		return digest, doc, false, err
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	key, err := BuildKey(opts)
	if err != nil {
		return "", nil, false, fmt.Errorf("computing the release cache key: %w", err)
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", nil, false, fmt.Errorf("release cache: %w", err)
	}
	// One builder per key across processes (the VM tier and other packages run at once);
	// different keys build side by side.
	unlock, err := lockFile(filepath.Join(c.Dir, key+".lock"))
	if err != nil {
		return "", nil, false, fmt.Errorf("release cache: %w", err)
	}
	defer unlock()
	entry := filepath.Join(c.Dir, key)
	if digest, doc, err := c.copyOut(entry, opts.Out); err == nil {
		fmt.Fprintf(log, "release build: %s from the release cache (%s), every file checked\n", opts.Version, entry)
		now := time.Now()
		os.Chtimes(filepath.Join(entry, cacheEntryName), now, now)
		return digest, doc, true, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(log, "release build: the cached release %s is damaged (%v): building it again\n", entry, err)
	}
	if err := os.RemoveAll(entry); err != nil {
		return "", nil, false, fmt.Errorf("release cache: removing %s: %w", entry, err)
	}
	tmp, err := os.MkdirTemp(c.Dir, ".build-"+key[:12]+"-")
	if err != nil {
		return "", nil, false, fmt.Errorf("release cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	built := opts
	built.Out = tmp
	digest, doc, err = build(built)
	if err != nil {
		return "", nil, false, err
	}
	// One pass over the new release: copied out to the caller, its digests recorded as
	// they are read.
	e := cacheEntry{Key: key, Digest: digest, Built: time.Now().UTC(), Took: time.Since(start).Round(time.Second).String(), Files: map[string]string{}}
	names, err := entryFiles(tmp)
	if err != nil {
		return "", nil, false, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return "", nil, false, err
	}
	for _, n := range names {
		os.Remove(filepath.Join(opts.Out, n))
		if e.Files[n], err = CopyFileSum(filepath.Join(tmp, n), filepath.Join(opts.Out, n)); err != nil {
			return "", nil, false, fmt.Errorf("copying the release just built: %w", err)
		}
	}
	raw, _ := json.MarshalIndent(e, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, cacheEntryName), raw, 0o644); err != nil {
		return "", nil, false, fmt.Errorf("release cache: %w", err)
	}
	if err := os.Rename(tmp, entry); err != nil {
		return "", nil, false, fmt.Errorf("release cache: %w", err)
	}
	fmt.Fprintf(log, "release build: kept in the release cache (%s)\n", entry)
	c.evict(key)
	return digest, doc, false, nil
}

// copyOut copies the entry's files into out, hashing each as it goes, and fails (leaving
// out without them) when any differs from the entry's record or the record is missing.
func (c *Cache) copyOut(entry, out string) (string, *apirelease.Document, error) {
	raw, err := os.ReadFile(filepath.Join(entry, cacheEntryName))
	if err != nil {
		return "", nil, err
	}
	var e cacheEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return "", nil, fmt.Errorf("reading %s: %w", cacheEntryName, err)
	}
	names, err := entryFiles(entry)
	if err != nil {
		return "", nil, err
	}
	if len(names) != len(e.Files) {
		return "", nil, fmt.Errorf("it holds %d files, its record %d", len(names), len(e.Files))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", nil, err
	}
	var copied []string
	fail := func(err error) (string, *apirelease.Document, error) {
		for _, n := range copied {
			os.Remove(filepath.Join(out, n))
		}
		return "", nil, err
	}
	for _, n := range names {
		want, ok := e.Files[n]
		if !ok {
			return fail(fmt.Errorf("%s is not in its record", n))
		}
		os.Remove(filepath.Join(out, n))
		copied = append(copied, n)
		got, err := CopyFileSum(filepath.Join(entry, n), filepath.Join(out, n))
		if err != nil {
			return fail(err)
		}
		if got != want {
			return fail(fmt.Errorf("%s has SHA-256 %s, recorded %s", n, got, want))
		}
	}
	doc, err := os.ReadFile(filepath.Join(out, apirelease.DocumentName))
	if err != nil {
		return fail(err)
	}
	parsed, err := apirelease.Parse(doc, e.Digest) // the digest recorded, checked first
	if err != nil {
		return fail(err)
	}
	return e.Digest, parsed, nil
}

// entryFiles are the release's files in dir: every regular file but the cache's record.
func entryFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range ents {
		if d.Type().IsRegular() && d.Name() != cacheEntryName {
			names = append(names, d.Name())
		}
	}
	return names, nil
}

// evict removes all but the Keep entries used last (never keep), and builds that were
// left unfinished a day ago or more.
func (c *Cache) evict(keep string) {
	n := c.Keep
	if n <= 0 {
		n = DefaultCacheKeep
	}
	ents, err := os.ReadDir(c.Dir)
	if err != nil {
		return
	}
	type used struct {
		key string
		at  time.Time
	}
	var entries []used
	for _, d := range ents {
		if !d.IsDir() {
			continue
		}
		if strings.HasPrefix(d.Name(), ".build-") {
			if st, err := d.Info(); err == nil && time.Since(st.ModTime()) > 24*time.Hour {
				os.RemoveAll(filepath.Join(c.Dir, d.Name()))
			}
			continue
		}
		st, err := os.Stat(filepath.Join(c.Dir, d.Name(), cacheEntryName))
		if err != nil || d.Name() == keep {
			continue
		}
		entries = append(entries, used{d.Name(), st.ModTime()})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].at.After(entries[j].at) })
	for i, e := range entries {
		if i+1 < n { // keep is the n-th
			continue
		}
		// Not while another process uses it. The lock file stays: removing it would let two
		// processes lock two different files of one name.
		if unlock, err := tryLockFile(filepath.Join(c.Dir, e.key+".lock")); err == nil {
			os.RemoveAll(filepath.Join(c.Dir, e.key))
			unlock()
		}
	}
}

// BuildKey is the cache key of a build: a SHA-256 of everything Build reads but Out and
// Log.
func BuildKey(opts BuildOptions) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "liken release cache 1\nversion %s\nstand-in %v\ntest switches %v\nepoch %d\nk3s version %s\n",
		opts.Version, opts.StandIn, opts.TestSwitches, opts.Epoch.Unix(), opts.K3sVersion)
	deb, err := FindKernelDeb(opts.KernelDeb, opts.KernelCache)
	if err != nil {
		return "", err
	}
	sum, err := fileSHA256(deb)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "kernel package %s\n", sum)
	if opts.K3s != "" {
		if sum, err = fileSHA256(opts.K3s); err != nil {
			return "", fmt.Errorf("k3s binary: %w", err)
		}
		fmt.Fprintf(h, "k3s %s\n", sum)
	}
	fmt.Fprintf(h, "liken %s\n", sourceVersion(opts.Source))
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOVERSION: %w", err)
	}
	fmt.Fprintf(h, "go %s", goVersion)
	// GRUB, mksquashfs, mtools and the mkfs tools the image carries come from the host's
	// packages: any change of one rebuilds.
	pkgs, err := exec.Command("dpkg-query", "-W", "-f", "${Package} ${Version}\n").Output()
	if err != nil {
		return "", fmt.Errorf("listing the host's packages (dpkg-query): %w", err)
	}
	fmt.Fprintf(h, "host packages %x\n", sha256.Sum256(pkgs))
	files, err := sourceFiles(opts.Source)
	if err != nil {
		return "", fmt.Errorf("listing the source tree %s: %w", opts.Source, err)
	}
	for _, f := range files {
		p := filepath.Join(opts.Source, f)
		st, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist): // tracked, deleted in the work tree
			fmt.Fprintf(h, "file %q deleted\n", f)
		case err != nil:
			return "", err
		case st.Mode().IsRegular():
			sum, err := fileSHA256(p)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "file %q %o %s\n", f, st.Mode().Perm()&0o111, sum)
		case st.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(h, "link %q %q\n", f, target)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sourceFiles lists the source tree's files: those git tracks or would track (ignored
// build outputs such as bin/ and test/tools/bin/ aside; the tools are built from
// test/tools' go.mod and go.sum, which are listed), or, outside a git checkout, every
// file but those outputs.
func sourceFiles(dir string) ([]string, error) {
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err == nil {
		var files []string
		for _, f := range bytes.Split(out, []byte{0}) {
			if len(f) > 0 {
				files = append(files, string(f))
			}
		}
		sort.Strings(files)
		return files, nil
	}
	skip := map[string]bool{".git": true, "bin": true, "out": true, "test/tools/bin": true, ".test-report": true}
	var files []string
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if skip[filepath.ToSlash(rel)] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// lockFile takes an exclusive lock on path (made if missing), waiting for it.
func lockFile(path string) (func(), error) {
	return flock(path, syscall.LOCK_EX)
}

// tryLockFile is lockFile that fails at once when another holds the lock.
func tryLockFile(path string) (func(), error) {
	return flock(path, syscall.LOCK_EX|syscall.LOCK_NB)
}

func flock(path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
