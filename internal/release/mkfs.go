package release

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"liken.dev/liken/internal/host/datadisk"
)

// DynamicTool is a program taken from the build host's Debian package, with the libraries it
// links, into a directory of the image: it runs through the loader beside it (dir/ld.so
// --library-path dir/lib), so the image gains no /lib, no shell and nothing on any PATH.
type DynamicTool struct{ Name, Path, Package string }

// MkfsTools are the programs init makes data disks' file systems with (internal/host/
// datadisk): e2fsprogs is the reference ext4 implementation, and no Go library yet writes
// ext4 that well. They go under datadisk.ToolsDir.
var MkfsTools = []DynamicTool{
	{"mke2fs", "/sbin/mke2fs", "e2fsprogs"},
	{"mkfs.fat", "/sbin/mkfs.fat", "dosfstools"},
}

// lddLine is one library ldd resolves ("libc.so.6 => /lib/.../libc.so.6 (0x...)") or the
// loader ("/lib64/ld-linux-x86-64.so.2 (0x...)").
var lddLine = regexp.MustCompile(`^\s*(?:(\S+) => )?(/\S+) \(0x[0-9a-f]+\)$`)

// stageMkfsTools copies MkfsTools, their libraries and their loader under stage, and
// records which package versions they came from.
func stageMkfsTools(stage string, put func(rel, src string, mode os.FileMode) error) error {
	return stageDynamic(stage, strings.TrimPrefix(datadisk.ToolsDir, "/"), MkfsTools, nil, put)
}

// stageDynamic copies tools into dir (relative to stage), the libraries they and the
// plugins (shared objects they load at run time, into dir/PLUGINDIR) link into dir/lib and
// their loader to dir/ld.so, and records in dir/versions which package versions they came from.
func stageDynamic(stage, dir string, tools []DynamicTool, plugins map[string][]string, put func(rel, src string, mode os.FileMode) error) error {
	var versions []string
	loader, copied := "", map[string]bool{}
	libs := func(path string) error {
		out, err := exec.Command("ldd", path).Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %w", path, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			m := lddLine.FindStringSubmatch(l)
			switch {
			case m == nil:
				continue
			case m[1] == "": // the loader
				if loader != "" && loader != m[2] {
					return fmt.Errorf("%s wants the loader %s, another tool %s", path, m[2], loader)
				}
				loader = m[2]
			case !copied[m[2]]:
				copied[m[2]] = true
				if err := put(filepath.Join(dir, "lib", filepath.Base(m[1])), m[2], 0o644); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, t := range tools {
		if err := put(filepath.Join(dir, t.Name), t.Path, 0o755); err != nil {
			return fmt.Errorf("%s (apt package %s): %w", t.Path, t.Package, err)
		}
		if err := libs(t.Path); err != nil {
			return err
		}
		v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", t.Package).Output()
		if err != nil {
			return fmt.Errorf("dpkg-query %s: %w", t.Package, err)
		}
		versions = append(versions, fmt.Sprintf("%s %s (%s)", t.Package, v, t.Name))
	}
	for sub, paths := range plugins {
		for _, p := range paths {
			if err := put(filepath.Join(dir, sub, filepath.Base(p)), p, 0o644); err != nil {
				return err
			}
			if err := libs(p); err != nil {
				return err
			}
		}
	}
	if loader == "" {
		return fmt.Errorf("ldd named no loader for %s", tools[0].Path)
	}
	if err := put(filepath.Join(dir, "ld.so"), loader, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(stage, dir, "versions"), []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
