package cli

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"liken.dev/liken/internal/balancer"
	"liken.dev/liken/internal/lab"
	"liken.dev/liken/internal/release"
)

const defaultLabDir = "out/lab"

func newLab() *cobra.Command {
	return group(&cobra.Command{
		Use:   "lab",
		Short: "run a liken cluster of QEMU machines on this host",
		Long: `A lab is a liken cluster on this host: a release with liken's k3s stand-in built from this
source tree into a local channel, a Cluster and Machines, their layers, installed disk images,
and the machines booted in QEMU (KVM where it works, else software emulation) on a private
network between them, the server's API forwarded to a local port. Everything lives in one
directory; 'liken lab down' stops what 'up' started and removes it.`,
	}, newLabUp(), newLabAdd(), newLabStatus(), newLabDown(), newLabPublish(), newLabServeChannel())
}

func newLabUp() *cobra.Command {
	o := lab.Defaults
	o.Dir = defaultLabDir
	cmd := &cobra.Command{
		Use:   "up",
		Short: "build a stand-in release, install the machines' disks and boot them until every machine is Ready",
		Example: `  liken lab up
  liken lab up --agents 2 --dir /tmp/lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := lab.CheckServers(o.Servers); err != nil {
				return usageErr("%v", err)
			}
			if o.Source == "" {
				src, err := findSource()
				if err != nil {
					return err
				}
				o.Source = src
			}
			if exe, err := os.Executable(); err == nil {
				o.ChannelServer = []string{exe, "lab", "serve-channel"}
			}
			o.Out = cmd.ErrOrStderr()
			// A closed terminal too: up's failure path then stops the machines it started
			// (main cancels on SIGINT and SIGTERM; SIGHUP would end the process without it).
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGHUP)
			defer stop()
			start := time.Now()
			st, err := lab.Up(ctx, o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "\nThe lab is up: %d machines Ready in %s.\n\n", len(st.Machines), time.Since(start).Round(time.Second))
			if err := printLabStatus(cmd, st); err != nil {
				return err
			}
			demo := ""
			for _, m := range st.Machines {
				if m.DemoPort != 0 {
					demo = fmt.Sprintf("http://127.0.0.1:%d/", m.DemoPort)
					break
				}
			}
			fmt.Fprintf(w, `
Try:
  export KUBECONFIG=%s
  kubectl get nodes; kubectl get machines     (test/tools/bin/kubectl after make tools)
  liken status
  curl %s                     (the demo, Deployment web: %s)
  kubectl edit machine %s                     (a sysctl applies live; a network change waits for approval)
  liken lab status --dir %s
  liken lab down --dir %s

The machines run liken's k3s stand-in, not k3s: real containerd, runc, kubelet, kube-proxy,
flannel (vxlan) and CoreDNS laid out and deployed as k3s's, with the pause and CoreDNS images
in the release (%s); not yet traefik, servicelb, local-path, metrics-server, network policy
or the embedded registry (docs/k3s.md, "The stand-in's node").
`, st.Kubeconfig, demo, filepath.Join(st.Dir, "demo.yaml"), st.Machines[len(st.Machines)-1].Name, o.Dir, o.Dir, release.PauseImageRef)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", o.Dir, "the lab's directory (its files, disks and consoles)")
	f.IntVar(&o.Servers, "servers", o.Servers, "server machines: 1, 3 or 5 (with more than one, the API port is a load balancer over them)")
	f.IntVar(&o.Agents, "agents", o.Agents, "agent machines")
	f.IntVar(&o.ServerMiB, "server-memory", o.ServerMiB, "each server's memory in MiB")
	f.IntVar(&o.AgentMiB, "agent-memory", o.AgentMiB, "each agent's memory in MiB")
	f.IntVar(&o.ServerCPUs, "server-cpus", o.ServerCPUs, "each server's virtual CPUs")
	f.IntVar(&o.AgentCPUs, "agent-cpus", o.AgentCPUs, "each agent's virtual CPUs")
	f.IntVar(&o.APIPort, "api-port", o.APIPort, "the local port the server's API is forwarded to")
	f.StringVar(&o.Source, "source", "", "liken's source tree the release is built from (default: the one holding the current directory)")
	f.StringVar(&o.Version, "version", o.Version, "the release's version")
	f.StringVar(&o.Accel, "accel", o.Accel, "auto (KVM where it boots a kernel here, else software emulation), kvm or tcg")
	f.DurationVar(&o.Timeout, "timeout", o.Timeout, "how long to wait for every machine to be Ready")
	f.StringVar(&o.KernelArgs, "kernel-args", "", "extra kernel arguments for every boot of every machine, as liken install --kernel-args (machines added later get them too)")
	return cmd
}

func newLabAdd() *cobra.Command {
	dir, timeout := defaultLabDir, lab.Defaults.Timeout
	cmd := &cobra.Command{
		Use:   "add",
		Short: "add an agent machine to the lab, as install.md adds a machine: a newer layer for the server, then the new agent",
		Long: `Adds one agent machine to a running lab the way docs/install.md adds a machine to a
cluster: the layers are built again with one more Machine from the lab's identity, the server
is power-cycled with the newer layer (install --layer-only), so that bootstrap makes the new
Machine and leaves what exists as it is, and the new agent's disk is installed with the
release the Cluster runs now and booted. It returns once every machine is Ready.`,
		Example: `  liken lab add
  liken lab add --dir /tmp/lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGHUP)
			defer stop()
			m, err := lab.Add(ctx, dir, cmd.ErrOrStderr(), timeout)
			if err != nil {
				return err
			}
			st, err := lab.Read(dir)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\n%s joined the lab.\n\n", m.Name)
			return printLabStatus(cmd, st)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "the lab's directory")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long to wait for every machine to be Ready")
	return cmd
}

func newLabStatus() *cobra.Command {
	dir := defaultLabDir
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the lab's machines, their processes and the fleet",
		Example: `  liken lab status
  liken lab status --dir /tmp/lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Read(dir)
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("no lab in %s", dir)
			}
			if err != nil {
				return err
			}
			return printLabStatus(cmd, st)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "the lab's directory")
	return cmd
}

func printLabStatus(cmd *cobra.Command, st *lab.State) error {
	w := cmd.OutOrStdout()
	running := st.Running()
	fmt.Fprintf(w, "lab %s (release %s), kubeconfig %s, API on 127.0.0.1:%d\n", st.Dir, st.Version, st.Kubeconfig, st.APIPort)
	for _, m := range st.Machines {
		state := "stopped"
		if pid, ok := running[m.Name]; ok {
			state = "running, pid " + strconv.Itoa(pid)
		}
		fmt.Fprintf(w, "  %-14s %-6s %-15s %s (console %s)\n", m.Name, m.Role, m.IP, state, m.Console)
	}
	if len(running) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	var out, errb bytes.Buffer
	s := newStatus()
	s.SetArgs([]string{"--kubeconfig", st.Kubeconfig})
	s.SetOut(&out)
	s.SetErr(&errb)
	if err := s.ExecuteContext(cmd.Context()); err != nil {
		fmt.Fprintf(w, "liken status: %v\n", err)
		return nil
	}
	_, err := w.Write(out.Bytes())
	return err
}

func newLabDown() *cobra.Command {
	dir := defaultLabDir
	cmd := &cobra.Command{
		Use:   "down",
		Short: "stop the lab's machines and channel server (by PID) and remove its directory",
		Example: `  liken lab down
  liken lab down --dir /tmp/lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.Down(dir, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "the lab's directory")
	return cmd
}

func newLabPublish() *cobra.Command {
	dir, version := defaultLabDir, ""
	cmd := &cobra.Command{
		Use:   "publish --version V",
		Short: "build another release into the lab's channel and pin it in the Cluster, to try an upgrade",
		Example: `  liken lab publish --version 2026.12.01-002
  liken upgrade 2026.12.01-002 --kubeconfig out/lab/layers/admin.kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if version == "" {
				return usageErr("give --version V, the new release's version")
			}
			if _, err := lab.Publish(cmd.Context(), dir, version, cmd.ErrOrStderr()); err != nil {
				return err
			}
			st, _ := lab.Read(dir)
			fmt.Fprintf(cmd.OutOrStdout(), "Try: liken upgrade %s --kubeconfig %s   (then liken approve-reboot, liken status)\n", version, st.Kubeconfig)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", dir, "the lab's directory")
	cmd.Flags().StringVar(&version, "version", "", "the new release's version")
	return cmd
}

// newLabServeChannel is the lab's channel server (and registry of the demo's image), which
// `lab up` starts in the background.
func newLabServeChannel() *cobra.Command {
	var images, api string
	var apiServers []string
	cmd := &cobra.Command{
		Use:    "serve-channel DIR PORT",
		Short:  "serve a channel directory over HTTP, and image archives as a registry (started by lab up)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return usageErr("port %q", args[1])
			}
			// Loopback is enough: QEMU's user network turns a machine's connection to 10.0.2.2
			// into one to the host's loopback.
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			if api != "" {
				// QEMU accepts on a forwarded port whether or not the machine behind it
				// listens: the check is a TLS handshake with the server itself, every 2 s.
				b := &balancer.Balancer{Listen: api, Name: "the lab's API load balancer", Log: cmd.OutOrStdout(),
					Check: balancer.TLSCheck, CheckEvery: 2 * time.Second}
				b.SetServers(apiServers)
				if err := b.Serve(cmd.Context()); err != nil {
					return err
				}
			}
			return lab.ServeChannel(cmd.Context(), l, args[0], images, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&images, "images", "", "a directory of image archives to serve as a registry under /v2/")
	cmd.Flags().StringVar(&api, "api", "", "also balance connections to this address (the lab's API) over --api-servers")
	cmd.Flags().StringSliceVar(&apiServers, "api-servers", nil, "the servers' API addresses (host:port) for --api")
	return cmd
}

// findSource finds liken's source tree from the current directory up.
func findSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module liken.dev/liken\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("liken lab builds its release from liken's source: run it inside liken's source tree, or give --source DIR")
		}
		dir = parent
	}
}
