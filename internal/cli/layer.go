package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/layer"
)

// builtLayer is one layer in layer's result, as -o prints it.
type builtLayer struct {
	Role   string `json:"role"`
	Path   string `json:"path"`
	Size   int    `json:"size"`
	Digest string `json:"digest"`
}

type builtLayers struct {
	Layers     []builtLayer `json:"layers"`
	Kubeconfig string       `json:"kubeconfig"`
	Identity   string       `json:"identity"`
}

func newLayer() *cobra.Command {
	var (
		o                                     output
		cluster, machines, out, idDir, server string
		standIn, newIdentity                  bool
	)
	cmd := &cobra.Command{
		Use:   "layer --cluster FILE --machines DIR",
		Short: "build the deployment layers from a Cluster and its Machine manifests",
		Long: `Builds the deployment layers (one for servers, one for agents) from a Cluster and its
Machines, with the cluster's identity: its certificate authorities and join token. The
identity is kept in --identity (default OUT/identity) and reused by every later build, so
layers built again still join the same cluster. Keep it safe: it holds the CA keys.`,
		Example: `  liken layer --cluster cluster.yaml --machines machines/ --out layer
  liken layer --cluster cluster.yaml --machines machines/ --identity ~/secrets/prod-identity`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(); err != nil {
				return err
			}
			if cluster == "" || machines == "" {
				return usageErr("--cluster and --machines are required")
			}
			explicit := idDir != ""
			if !explicit {
				idDir = filepath.Join(out, "identity")
			}
			if _, err := os.Stat(idDir); errors.Is(err, os.ErrNotExist) && explicit && !newIdentity {
				// A mistyped path would silently make a new cluster identity whose layers
				// join no existing machine.
				return usageErr("--identity %s does not exist; building layers there would create a new cluster identity (new CAs and join token): add --new-identity to do so deliberately", idDir)
			}
			docs, err := loadAll(cmd.InOrStdin(), cluster, machines)
			if err != nil {
				return err
			}
			// The Cluster file holds the Cluster and nothing else: a Machine or a second
			// document there would otherwise be taken (or lost) without a word.
			var inCluster []layer.TypeMeta
			src := cluster
			if src == "-" {
				src = "(stdin)" // as readManifests names it
			}
			for _, d := range docs {
				if d.Source == src || strings.HasPrefix(d.Source, src+"#") {
					inCluster = append(inCluster, layer.TypeMeta{APIVersion: d.Object.GetAPIVersion(), Kind: d.Object.GetKind()})
				}
			}
			if err := layer.CheckOne(cluster, "Cluster", inCluster); err != nil {
				return err
			}
			plan, err := joinPlan(docs)
			if err != nil {
				return err
			}
			if server == "" {
				// The machines' join address serves the operator too; with none (a lone
				// server on DHCP) BuildLayers asks for --server.
				server = plan.URL
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return fmt.Errorf("making %s: %w", out, err)
			}
			res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: idDir, OutDir: out, Server: server, StandInNodeCredentials: standIn})
			if err != nil {
				return err
			}
			result := builtLayers{Kubeconfig: res.Kubeconfig, Identity: idDir}
			for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
				result.Layers = append(result.Layers, builtLayer{Role: string(role), Path: res.Layers[role], Size: res.Sizes[role], Digest: res.Digests[role]})
			}
			return o.print(cmd.OutOrStdout(), result, func(w io.Writer) {
				for _, l := range result.Layers {
					fmt.Fprintf(w, "%s layer: %s (%d bytes, %s)\n", l.Role, l.Path, l.Size, l.Digest)
				}
				fmt.Fprintf(w, "admin kubeconfig: %s\nidentity (CA keys; keep it to rebuild layers): %s\n", result.Kubeconfig, idDir)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cluster, "cluster", "", "the Cluster manifest (- for standard input)")
	f.StringVar(&machines, "machines", "", "a directory (or file) of Machine manifests")
	f.StringVar(&out, "out", "layer", "where to write server.layer, agent.layer and admin.kubeconfig")
	f.StringVar(&idDir, "identity", "", "the cluster identity to keep and reuse (default OUT/identity); it holds the CA keys")
	f.BoolVar(&newIdentity, "new-identity", false, "create a new cluster identity in --identity when it does not exist")
	f.BoolVar(&standIn, "stand-in-node-credentials", false, "add node certificates for liken's k3s stand-in (test clusters only; real k3s makes its own)")
	f.StringVar(&server, "server", "", "API URL for admin.kubeconfig (default: the Cluster's registrationAddress, else the first server's first static address, on port 6443)")
	o.add(cmd)
	return cmd
}
