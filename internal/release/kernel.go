package release

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/kmod"
)

// Kernel is a Debian linux-image package unpacked for a release.
type Kernel struct {
	// Version is the kernel release, such as 6.1.0-48-amd64.
	Version string
	// Package is the .deb's file name and PackageSHA256 its hex SHA-256.
	Package, PackageSHA256 string
	// Root holds boot/vmlinuz-<version> and lib/modules/<version> with depmod's files.
	Root string
	deps *kmod.Deps
}

// Vmlinuz is the kernel image's path.
func (k *Kernel) Vmlinuz() string { return filepath.Join(k.Root, "boot", "vmlinuz-"+k.Version) }

// Config is the kernel's build configuration (boot/config-<version>).
func (k *Kernel) Config() string { return filepath.Join(k.Root, "boot", "config-"+k.Version) }

// ModulesDir is lib/modules/<version>.
func (k *Kernel) ModulesDir() string { return filepath.Join(k.Root, "lib", "modules", k.Version) }

// Resolve returns the module files (relative to ModulesDir) the named modules need, in
// load order.
func (k *Kernel) Resolve(names ...string) ([]string, error) { return k.deps.Resolve(names...) }

var vmlinuzRE = regexp.MustCompile(`^\./boot/vmlinuz-(.+)$`)

// UnpackKernelDeb unpacks a linux-image .deb (with dpkg-deb) into dir and runs depmod on its
// modules: the package ships no modules.dep, its postinst makes one.
func UnpackKernelDeb(deb, dir string) (*Kernel, error) {
	sum, err := fileSHA256(deb)
	if err != nil {
		return nil, err
	}
	return unpackKernelDeb(deb, sum, dir)
}

// unpackKernelDeb is UnpackKernelDeb of the package whose SHA-256 is sum.
func unpackKernelDeb(deb, sum, dir string) (*Kernel, error) {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("reading %s with dpkg-deb: %w", deb, err)
	}
	k := &Kernel{Package: filepath.Base(deb), PackageSHA256: sum, Root: dir}
	tr := tar.NewReader(bufio.NewReaderSize(out, 1<<20))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("reading %s: %w", deb, err)
		}
		name := h.Name
		if m := vmlinuzRE.FindStringSubmatch(name); m != nil {
			k.Version = m[1]
		}
		if !strings.HasPrefix(name, "./boot/vmlinuz-") && !strings.HasPrefix(name, "./boot/config-") && !strings.HasPrefix(name, "./lib/modules/") {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(name, "./")))
		if !strings.HasPrefix(dst, filepath.Clean(dir)+string(filepath.Separator)) {
			return nil, fmt.Errorf("%s: entry %q leaves the package", deb, name)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return nil, err
		}
		f.Close()
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	if k.Version == "" {
		return nil, fmt.Errorf("%s holds no boot/vmlinuz-*: not a linux-image package", deb)
	}
	if err := depmod(dir, k.Version); err != nil {
		return nil, err
	}
	return k, k.readDeps()
}

// readDeps reads depmod's index of the modules.
func (k *Kernel) readDeps() error {
	f, err := os.Open(filepath.Join(k.ModulesDir(), "modules.dep"))
	if err != nil {
		return err
	}
	defer f.Close()
	k.deps, err = kmod.ParseDeps(f)
	return err
}

func depmod(root, version string) error {
	out, err := exec.Command("depmod", "-b", root, version).CombinedOutput()
	if err != nil {
		return fmt.Errorf("depmod -b %s %s: %w: %s", root, version, err, out)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, bufferSize)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FindKernelDeb returns the linux-image .deb to use: path when given, else the package
// linux-image-amd64 depends on, downloaded with apt-get into cacheDir (Debian keeps only the
// newest kernel package, so the release records which one it used).
func FindKernelDeb(path, cacheDir string) (string, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("kernel package: %w", err)
		}
		return path, nil
	}
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return "", fmt.Errorf("finding the current kernel package (apt-cache depends linux-image-amd64): %w; give --kernel-deb", err)
	}
	var pkg string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			pkg = f[1]
		}
	}
	if pkg == "" {
		return "", errors.New("apt-cache names no kernel package for linux-image-amd64; give --kernel-deb")
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	if m, _ := filepath.Glob(filepath.Join(cacheDir, pkg+"_*.deb")); len(m) > 0 {
		sort.Strings(m)
		return m[len(m)-1], nil
	}
	cmd := exec.Command("apt-get", "download", pkg)
	cmd.Dir = cacheDir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download %s: %w: %s", pkg, err, out)
	}
	m, _ := filepath.Glob(filepath.Join(cacheDir, pkg+"_*.deb"))
	if len(m) == 0 {
		return "", fmt.Errorf("apt-get download %s left no .deb in %s", pkg, cacheDir)
	}
	sort.Strings(m)
	return m[len(m)-1], nil
}

// unpackedManifest is written last into a kernel package unpacked in the cache: every file's
// size and modification time, so an unfinished entry, or one whose files were changed, added
// or removed since, is found and unpacked again.
const unpackedManifest = "liken-unpacked.json"

// unpackedIndex is the manifest's content.
type unpackedIndex struct {
	Version string            `json:"version"`
	Files   map[string]string `json:"files"`
}

// UnpackKernelDebCached is UnpackKernelDeb into cacheDir/unpacked/<the package's SHA-256>,
// done once per package: dpkg-deb's decompression and depmod took 36 s of each release
// build beside other work, five builds a test run. An entry is used only when every file
// has the size and modification time recorded as it was unpacked, as git's index checks a
// work tree (hashing its 405 MB again took 8-30 s on a busy host, most of what the cache
// saves); one that differs is unpacked again. Builds only read it. Concurrent builds wait
// for each other on the entry's lock.
func UnpackKernelDebCached(deb, cacheDir string) (*Kernel, error) {
	sum, err := fileSHA256(deb)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cacheDir, "unpacked", sum)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if k, err := openUnpacked(deb, sum, dir); err == nil {
		return k, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("removing a damaged unpacked kernel: %w", err)
	}
	k, err := unpackKernelDeb(deb, sum, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	files, err := statTree(dir)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(unpackedIndex{Version: k.Version, Files: files})
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(filepath.Join(dir, unpackedManifest), b, 0o644); err != nil {
		return nil, err
	}
	return k, nil
}

// openUnpacked returns the kernel unpacked in dir when its manifest is there and every file
// matches it.
func openUnpacked(deb, sum, dir string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, unpackedManifest))
	if err != nil {
		return nil, err
	}
	var m unpackedIndex
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", unpackedManifest, err)
	}
	got, err := statTree(dir)
	if err != nil {
		return nil, err
	}
	if m.Version == "" || !maps.Equal(got, m.Files) {
		return nil, fmt.Errorf("the kernel unpacked in %s differs from what was recorded", dir)
	}
	k := &Kernel{Version: m.Version, Package: filepath.Base(deb), PackageSHA256: sum, Root: dir}
	return k, k.readDeps()
}

// statTree is the size and modification time of every file under dir but the manifest, by
// slash path.
func statTree(dir string) (map[string]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == unpackedManifest {
			return nil
		}
		if !d.Type().IsRegular() {
			files[filepath.ToSlash(rel)] = "not a regular file"
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)] = fmt.Sprintf("%d bytes, modified %d", fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	return files, err
}
