// Package kmod resolves kernel modules and their dependencies from modules.dep (as depmod
// writes it) and loads them with finit_module: liken's images have no modprobe.
package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Deps maps each module name (with '-' folded to '_') to its file, relative to
// /lib/modules/<version>, and the files of the modules it needs, in load order.
type Deps struct {
	file map[string]string
	deps map[string][]string // file → its dependencies' files, deepest last as in modules.dep
}

// Name folds a module name or file to its canonical name: "virtio-rng.ko" → "virtio_rng".
func Name(s string) string {
	s = filepath.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz", ".ko"} {
		s = strings.TrimSuffix(s, ext)
	}
	return strings.ReplaceAll(s, "-", "_")
}

// ParseDeps reads modules.dep: "kernel/a.ko: kernel/b.ko kernel/c.ko".
func ParseDeps(r io.Reader) (*Deps, error) {
	d := &Deps{file: map[string]string{}, deps: map[string][]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		d.file[Name(mod)] = mod
		d.deps[mod] = strings.Fields(deps)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.dep: %w", err)
	}
	if len(d.file) == 0 {
		return nil, errors.New("modules.dep lists no modules")
	}
	return d, nil
}

// Resolve returns the files of the named modules and everything they need, each once, in
// an order that loads every dependency before the modules needing it.
func (d *Deps) Resolve(names ...string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	var visit func(file string)
	visit = func(file string) {
		if seen[file] {
			return
		}
		seen[file] = true
		deps := d.deps[file]
		// modules.dep lists the deepest dependency last; load it first.
		for i := len(deps) - 1; i >= 0; i-- {
			visit(deps[i])
		}
		order = append(order, file)
	}
	var missing []string
	for _, n := range names {
		f, ok := d.file[Name(n)]
		if !ok {
			missing = append(missing, n)
			continue
		}
		visit(f)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("kernel modules not in this kernel: %s", strings.Join(missing, ", "))
	}
	return order, nil
}

// Load loads the module at path (relative to dir) with finit_module. A module already
// loaded (or built in) is not an error.
func Load(dir, file, params string) error {
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("loading module %s: %w", Name(file), err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), params, 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading module %s: %w", Name(file), err)
	}
	return nil
}
