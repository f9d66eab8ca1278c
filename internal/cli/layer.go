package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/identity"
	"liken.dev/liken/internal/manifest"
)

func runLayer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("layer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cluster := fs.String("cluster", "", "the Cluster manifest")
	machines := fs.String("machines", "", "a directory (or file) of Machine manifests")
	out := fs.String("out", "layer", "where to write server.layer, agent.layer and admin.kubeconfig")
	identityDir := fs.String("identity", "", "the cluster identity to keep and reuse (default OUT/identity); keep it safe: it holds the CA keys")
	standIn := fs.Bool("stand-in-node-credentials", false, "add node certificates for liken's k3s stand-in (test clusters only; real k3s makes its own)")
	server := fs.String("server", "", "API URL for admin.kubeconfig (default: the first server's first static address)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: liken layer --cluster FILE --machines DIR [--out DIR] [--identity DIR] [--server URL]")
		fmt.Fprintln(stderr, "Builds the deployment layers (one for servers, one for agents) from a Cluster and its Machines.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return errUsage
	}
	if *cluster == "" || *machines == "" || fs.NArg() != 0 {
		fs.Usage()
		return fmt.Errorf("%w: --cluster and --machines are required", errUsage)
	}
	if *identityDir == "" {
		*identityDir = filepath.Join(*out, "identity")
	}
	var docs []manifest.Document
	seen := map[string]bool{} // the machines directory may hold the Cluster file too
	for _, p := range []string{*cluster, *machines} {
		d, err := manifest.Load(p)
		if err != nil {
			return err
		}
		for _, doc := range d {
			abs, _ := filepath.Abs(doc.Source)
			if !seen[abs] {
				seen[abs] = true
				docs = append(docs, doc)
			}
		}
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	res, err := identity.BuildLayers(identity.Input{Docs: docs, IdentityDir: *identityDir, OutDir: *out, Server: *server, StandInNodeCredentials: *standIn})
	if err != nil {
		return err
	}
	for _, role := range []v1alpha1.Role{v1alpha1.RoleServer, v1alpha1.RoleAgent} {
		fmt.Fprintf(stdout, "%s layer: %s (%d bytes, %s)\n", role, res.Layers[role], res.Sizes[role], res.Digests[role])
	}
	fmt.Fprintf(stdout, "admin kubeconfig: %s\nidentity (CA keys; keep it to rebuild layers): %s\n", res.Kubeconfig, *identityDir)
	return nil
}
