package standin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/host/preflight"
)

// dataHash names the stand-in's data directory; k3s's is a hash of its bundle.
const dataHash = "k3s-standin"

// detectScript stands for k3s-root's iptables-detect.sh: a /bin/sh script, as the real one
// is, so a PATH that reaches it fails the preflight as k3s's would fail.
const detectScript = "#!/bin/sh\n# k3s-standin: stands for k3s-root's iptables-detect.sh, which needs a shell\nexit 1\n"

// unpackDataDir lays out a data directory as k3s unpacks its own (cmd/k3s/main.go: extract):
// dataDir/data/<hash>/bin and bin/aux, with data/current pointing at it. In bin/aux, the six
// iptables names are links to the detection script and xtables-nft-multi is a program; the
// stand-in's is itself (see IptablesMain). It returns the hash.
func unpackDataDir(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	aux := filepath.Join(dataDir, "data", dataHash, "bin", "aux")
	if err := os.MkdirAll(aux, 0o755); err != nil {
		return "", fmt.Errorf("unpacking the data directory: %w", err)
	}
	os.MkdirAll(filepath.Join(dataDir, "data", "cni"), 0o755)
	if err := os.WriteFile(filepath.Join(aux, "iptables-detect.sh"), []byte(detectScript), 0o755); err != nil {
		return "", err
	}
	for _, role := range []string{"k3s-server", "k3s-agent"} {
		if err := atomicfile.Symlink(self, filepath.Join(aux, "..", role)); err != nil {
			return "", err
		}
	}
	// mount and umount: the kubelet's, as k3s has busybox's there (mount.go).
	links := map[string]string{"xtables-nft-multi": self, "mount": self, "umount": self}
	for _, n := range k3s.IptablesNames {
		links[n] = "iptables-detect.sh"
	}
	for name, target := range links {
		if err := atomicfile.Symlink(target, filepath.Join(aux, name)); err != nil {
			return "", err
		}
	}
	if err := atomicfile.Symlink(dataHash, filepath.Join(dataDir, "data", "current")); err != nil {
		return "", err
	}
	return dataHash, nil
}

// dataDir is k3s's data directory as this config sets it.
func (c *Config) dataDir() string {
	if d, ok := c.Values["data-dir"].(string); ok && d != "" {
		return d
	}
	return k3s.DefaultPaths.DataDir
}

// stageAndRun does what k3s does before anything else (cmd/k3s/main.go, stageAndRun): it
// unpacks the data directory, sets PATH for itself and everything it runs, and K3S_DATA_DIR,
// and runs itself again from the data directory as bin/k3s-server or bin/k3s-agent. It
// returns only on failure. Skipped with LIKEN_STANDIN_PREFLIGHT=off and once done.
func (c *Config) stageAndRun(args []string, getenv func(string) string, log io.Writer) error {
	if getenv("LIKEN_STANDIN_PREFLIGHT") == "off" || getenv("K3S_DATA_DIR") != "" {
		return nil
	}
	hash, err := unpackDataDir(c.dataDir())
	if err != nil {
		return err
	}
	dir := filepath.Join(c.dataDir(), "data", hash)
	prefer, _ := c.Values["prefer-bundled-bin"].(bool)
	os.Setenv("PATH", k3s.ProcessPATH(c.dataDir(), hash, getenv("PATH"), prefer))
	os.Setenv("K3S_DATA_DIR", dir)
	prog := filepath.Join(dir, "bin", "k3s-"+c.Role)
	fmt.Fprintf(log, "k3s-standin: unpacked %s; running %s\n", dir, prog)
	return syscall.Exec(prog, append([]string{prog}, args...), os.Environ())
}

// preflight performs the host checks k3s performs at start, with the PATH stageAndRun set,
// and refuses to start at the first that fails. LIKEN_STANDIN_PREFLIGHT=off skips it where
// the host is no liken machine (host tests).
func (c *Config) preflight(getenv func(string) string, log io.Writer) error {
	if getenv("LIKEN_STANDIN_PREFLIGHT") == "off" {
		fmt.Fprintln(log, "k3s-standin: preflight off (LIKEN_STANDIN_PREFLIGHT=off: this host is not a liken machine)")
		return nil
	}
	built, err := apirelease.ReadBuildTime("/")
	if err != nil {
		return err
	}
	h := preflight.DefaultHost(getenv("PATH"), built)
	if err := preflight.Run(h.Checks(true, log), log, "k3s-standin"); err != nil {
		return err
	}
	return c.swapCheck(k3s.SwapOn(), log)
}

// swapCheck refuses to start with swap on unless the kubelet is told to accept it, as the
// kubelet does (its failSwapOn defaults to true; Kubernetes: Swap memory management).
func (c *Config) swapCheck(swapOn bool, log io.Writer) error {
	if !swapOn {
		return nil
	}
	if slices.Contains(c.list("kubelet-arg"), "fail-swap-on=false") {
		fmt.Fprintln(log, "k3s-standin: swap is on, and the kubelet accepts it (kubelet-arg fail-swap-on=false)")
		return nil
	}
	return errors.New("running with swap on is not supported, please disable swap or set --fail-swap-on flag to false (as the kubelet says)")
}

// IptablesMain is the stand-in run as one of the iptables names (through the stand-in's
// data directory's xtables-nft-multi). Where the release carries Debian's iptables
// (apirelease.StandInXtablesDir) it runs that, as the name it was run as; elsewhere it
// changes no rules, and says so.
func IptablesMain(argv0 string, stderr io.Writer) (int, bool) {
	name := filepath.Base(argv0)
	if !slices.Contains(k3s.IptablesNames, name) && name != "xtables-nft-multi" {
		return 0, false
	}
	if argv, env, ok := xtablesCommand("/", apirelease.StandInXtablesDir, name, os.Args[1:], os.Environ()); ok {
		err := syscall.Exec(argv[0], argv, env)
		fmt.Fprintf(stderr, "k3s-standin: %s: running %s: %v\n", name, argv[0], err)
		return 1, true
	}
	fmt.Fprintf(stderr, "k3s-standin: %s: liken's stand-in for k3s's xtables-nft-multi; it changes no rules (not iptables)\n", name)
	return 1, true
}

// xtablesCommand is the command line that runs dir's xtables-nft-multi as name through the
// loader beside it, its extensions from dir/ext; ok is false when dir has none under root.
func xtablesCommand(root, dir, name string, args, env []string) (argv, outEnv []string, ok bool) {
	prog := filepath.Join(dir, "xtables-nft-multi")
	if _, err := os.Stat(filepath.Join(root, prog)); err != nil {
		return nil, nil, false
	}
	argv = append([]string{filepath.Join(dir, "ld.so"), "--library-path", filepath.Join(dir, "lib"), "--argv0", name, prog}, args...)
	return argv, append(slices.Clone(env), "XTABLES_LIBDIR="+filepath.Join(dir, "ext")), true
}
