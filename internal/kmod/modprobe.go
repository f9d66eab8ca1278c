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

// OptionsDirs hold modprobe.d files ("options MODULE PARAM=VALUE ..."): init writes the
// Machine's module parameters into /run/modprobe.d/liken.conf at boot.
var OptionsDirs = []string{"/run/modprobe.d", "/etc/modprobe.d", "/lib/modprobe.d"}

// ModprobeMain is liken's modprobe, for what runs it: k3s ("modprobe -- NAME", through its
// PATH) and the kernel (kernel.modprobe, "modprobe -q -- NAME", when it wants a module on
// demand). It loads modules and aliases with their dependencies and their options; it does
// not remove modules. It returns the exit code.
func ModprobeMain(args []string, stderr io.Writer) int {
	var names, params []string
	quiet, all, dashes := false, false, false
	for _, a := range args {
		switch {
		case dashes || !strings.HasPrefix(a, "-"):
			names = append(names, a)
		case a == "--":
			dashes = true
		case a == "-q" || a == "--quiet":
			quiet = true
		case a == "-a" || a == "--all":
			all = true
		case a == "-b" || a == "--use-blacklist" || a == "-v" || a == "--verbose" || a == "-s" || a == "--syslog":
			// Nothing is blacklisted here; what is done is said either way.
		case a == "-r" || a == "--remove":
			fmt.Fprintln(stderr, "modprobe: liken's modprobe loads modules; it does not remove them")
			return 1
		default:
			fmt.Fprintf(stderr, "modprobe: option %s is not supported by liken's modprobe\n", a)
			return 1
		}
	}
	if !all && len(names) > 1 {
		// "modprobe NAME PARAM=VALUE ...": the rest are the module's parameters.
		names, params = names[:1], names[1:]
	}
	if len(names) == 0 {
		fmt.Fprintln(stderr, "modprobe: no module named")
		return 1
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	ix, err := OpenIndex(filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:])))
	if err != nil {
		fmt.Fprintf(stderr, "modprobe: %v\n", err)
		return 1
	}
	opts := ReadOptions(OptionsDirs)
	code := 0
	for _, n := range names {
		o := opts
		if len(params) > 0 {
			o = copyOptions(opts)
			o[Name(n)] = strings.TrimSpace(o[Name(n)] + " " + strings.Join(params, " "))
		}
		if _, err := ix.Probe(n, o); err != nil {
			code = 1
			if !quiet || !errors.Is(err, ErrNotFound) {
				fmt.Fprintf(stderr, "modprobe: %v\n", err)
			}
		}
	}
	return code
}

func copyOptions(o map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range o {
		out[k] = v
	}
	return out
}

// ReadOptions reads the "options MODULE PARAMS..." lines of the *.conf files in dirs, the
// earlier directory's file winning over a later one of the same name, as modprobe.d does.
func ReadOptions(dirs []string) map[string]string {
	files := map[string]string{}
	for i := len(dirs) - 1; i >= 0; i-- {
		entries, _ := os.ReadDir(dirs[i])
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".conf") {
				files[e.Name()] = filepath.Join(dirs[i], e.Name())
			}
		}
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	out := map[string]string{}
	for _, n := range names {
		f, err := os.Open(files[n])
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && fields[0] == "options" {
				m := Name(fields[1])
				out[m] = strings.TrimSpace(out[m] + " " + strings.Join(fields[2:], " "))
			}
		}
		f.Close()
	}
	return out
}

// OptionsFile is a modprobe.d file giving each module its parameters.
func OptionsFile(params map[string]string) []byte {
	var mods []string
	for m, p := range params {
		if p != "" {
			mods = append(mods, m)
		}
	}
	sort.Strings(mods)
	var b strings.Builder
	b.WriteString("# Written by liken-init from the Machine's spec.kernelModules.\n")
	for _, m := range mods {
		fmt.Fprintf(&b, "options %s %s\n", m, params[m])
	}
	return []byte(b.String())
}
