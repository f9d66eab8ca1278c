package kmod

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Index is what modprobe needs of a kernel's modules, from the files depmod writes in
// /lib/modules/<version>: modules.dep (files and dependencies), modules.alias (the aliases
// the kernel and programs ask for, such as nft-expr-counter), modules.builtin and
// modules.builtin.modinfo (what is built in, with its aliases: nothing to load).
type Index struct {
	Dir     string
	deps    *Deps
	aliases []alias
	builtin map[string]bool
	// builtinAliases are the aliases of built-in modules.
	builtinAliases []alias
}

type alias struct{ pattern, module string }

// OpenIndex reads the index in dir. modules.dep is required; the others are read when
// present.
func OpenIndex(dir string) (*Index, error) {
	ix := &Index{Dir: dir, builtin: map[string]bool{}}
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("reading the module index: %w", err)
	}
	ix.deps, err = ParseDeps(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	if f, err := os.Open(filepath.Join(dir, "modules.alias")); err == nil {
		ix.aliases, err = parseAliases(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			ix.builtin[Name(l)] = true
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin.modinfo")); err == nil {
		// NUL-separated records "module.key=value".
		for _, rec := range bytes.Split(b, []byte{0}) {
			mod, kv, ok := strings.Cut(string(rec), ".")
			if !ok {
				continue
			}
			if v, ok := strings.CutPrefix(kv, "alias="); ok {
				ix.builtinAliases = append(ix.builtinAliases, alias{v, Name(mod)})
			}
		}
	}
	return ix, nil
}

// parseAliases reads modules.alias: "alias PATTERN MODULE" lines.
func parseAliases(r io.Reader) ([]alias, error) {
	var out []alias
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "alias" {
			out = append(out, alias{f[1], Name(f[2])})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.alias: %w", err)
	}
	return out, nil
}

// ErrNotFound is a name that is no module, alias or built-in module of this kernel.
var ErrNotFound = errors.New("no such module or alias in this kernel")

// Lookup resolves a module name or alias as modprobe does: a module of that name, else the
// modules whose aliases match it (shell patterns), else a built-in module or alias, which
// needs nothing loaded (builtin true, no modules).
func (ix *Index) Lookup(name string) (modules []string, builtin bool, err error) {
	n := Name(name)
	if _, ok := ix.deps.file[n]; ok {
		return []string{n}, false, nil
	}
	if ix.builtin[n] {
		return nil, true, nil
	}
	seen := map[string]bool{}
	for _, a := range ix.aliases {
		if match(a.pattern, name) && !seen[a.module] {
			seen[a.module] = true
			modules = append(modules, a.module)
		}
	}
	if len(modules) > 0 {
		sort.Strings(modules)
		return modules, false, nil
	}
	for _, a := range ix.builtinAliases {
		if match(a.pattern, name) {
			return nil, true, nil
		}
	}
	return nil, false, fmt.Errorf("%s: %w", name, ErrNotFound)
}

// match is a shell pattern match (modules.alias uses fnmatch); a pattern path.Match
// cannot read is compared as it is.
func match(pattern, name string) bool {
	if ok, err := path.Match(pattern, name); err == nil {
		return ok
	}
	return pattern == name
}

// Probe loads name (a module or an alias) with everything it needs, dependencies first,
// giving options[module] to each module it loads by name. A built-in module, or one loaded
// already, is not an error. It returns the modules it loaded or found loaded.
func (ix *Index) Probe(name string, options map[string]string) ([]string, error) {
	mods, builtin, err := ix.Lookup(name)
	if err != nil || builtin {
		return nil, err
	}
	var done []string
	for _, m := range mods {
		order, err := ix.deps.Resolve(m)
		if err != nil {
			return done, err
		}
		for _, file := range order {
			if err := Load(ix.Dir, file, options[Name(file)]); err != nil {
				return done, err
			}
		}
		done = append(done, m)
	}
	return done, nil
}
