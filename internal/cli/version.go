package cli

import (
	"fmt"
	"io"
	"runtime/debug"
	"sort"

	"github.com/spf13/cobra"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"liken.dev/liken/internal/kube"
)

// versionInfo is what version prints.
type versionInfo struct {
	Liken   string   `json:"liken"`
	Commit  string   `json:"commit,omitempty"`
	Go      string   `json:"go"`
	Cluster *cluster `json:"cluster,omitempty"`
}

// cluster is what a cluster says of its versions.
type cluster struct {
	Kubernetes string `json:"kubernetes"`
	// Version is the Cluster's spec.version: the release every machine should run.
	Version string `json:"version,omitempty"`
	// Running counts the Machines by the release they report running.
	Running map[string]int `json:"running,omitempty"`
}

// kubeFlags are --kubeconfig and --context, on every command that talks to an API server;
// KUBECONFIG and ~/.kube/config apply as in kubectl.
type kubeFlags struct {
	kubeconfig, context string
	// cmd is the command the flags belong to: the API server's warnings go to its stderr.
	cmd *cobra.Command
}

func (k *kubeFlags) add(cmd *cobra.Command) {
	k.cmd = cmd
	cmd.Flags().StringVar(&k.kubeconfig, "kubeconfig", "", "the kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	cmd.Flags().StringVar(&k.context, "context", "", "the kubeconfig context to use")
}

func (k *kubeFlags) set(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("kubeconfig") || cmd.Flags().Changed("context")
}

func (k *kubeFlags) client() (clientcmd.ClientConfig, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: k.context}), nil
}

func newVersion() *cobra.Command {
	var o output
	var k kubeFlags
	cmd := &cobra.Command{
		Use:   "version",
		Short: "print liken's version; with --kubeconfig or --context, the cluster's too",
		Example: `  liken version
  liken version --kubeconfig layer/admin.kubeconfig -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			v := versionInfo{Liken: "(devel)"}
			if bi, ok := debug.ReadBuildInfo(); ok {
				v.Go = bi.GoVersion
				if bi.Main.Version != "" {
					v.Liken = bi.Main.Version
				}
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						v.Commit = s.Value
					}
				}
				for _, s := range bi.Settings {
					if s.Key == "vcs.modified" && s.Value == "true" && v.Commit != "" {
						v.Commit += " (modified)"
					}
				}
			}
			if k.set(cmd) {
				c, err := clusterVersions(cmd, &k)
				if err != nil {
					return err
				}
				v.Cluster = c
			}
			return o.print(cmd.OutOrStdout(), v, func(w io.Writer) {
				fmt.Fprintf(w, "liken %s", v.Liken)
				if v.Commit != "" {
					fmt.Fprintf(w, " (commit %s)", v.Commit)
				}
				fmt.Fprintf(w, ", %s\n", v.Go)
				if c := v.Cluster; c != nil {
					fmt.Fprintf(w, "cluster: Kubernetes %s", c.Kubernetes)
					if c.Version != "" {
						fmt.Fprintf(w, ", spec.version %s", c.Version)
					}
					fmt.Fprintln(w)
					var versions []string
					for ver := range c.Running {
						versions = append(versions, ver)
					}
					sort.Strings(versions)
					for _, ver := range versions {
						fmt.Fprintf(w, "  %d machines run %s\n", c.Running[ver], ver)
					}
				}
			})
		},
	}
	o.add(cmd)
	k.add(cmd)
	return cmd
}

func clusterVersions(cmd *cobra.Command, k *kubeFlags) (*cluster, error) {
	cc, _ := k.client()
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the cluster: %w", err)
	}
	sv, err := dc.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("asking the API server %s for its version: %w", cfg.Host, err)
	}
	out := &cluster{Kubernetes: sv.GitVersion}
	lc, err := kube.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	if c, err := lc.Cluster(cmd.Context()); err == nil {
		out.Version = string(c.Spec.Version)
	}
	if ms, err := lc.Machines(cmd.Context()); err == nil {
		out.Running = map[string]int{}
		for _, m := range ms {
			ver := "unknown"
			if m.Status.Release != nil && m.Status.Release.Version != "" {
				ver = m.Status.Release.Version
			}
			out.Running[ver]++
		}
	}
	return out, nil
}
