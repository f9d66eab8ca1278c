package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"liken.dev/liken/internal/manifest"
)

func runValidate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: liken validate PATH...")
		fmt.Fprintln(stderr, "Checks every Cluster and Machine in the files or directories given, with the")
		fmt.Fprintln(stderr, "schema, defaults and rules the Kubernetes API server applies to them.")
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return errUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("%w: give at least one file or directory", errUsage)
	}
	v, err := manifest.NewValidator()
	if err != nil {
		return err
	}
	var docs []manifest.Document
	for _, p := range fs.Args() {
		d, err := manifest.Load(p)
		if err != nil {
			return err
		}
		docs = append(docs, d...)
	}
	res := manifest.CheckSet(v, docs)
	for _, r := range res.Objects {
		if len(r.Errors) == 0 {
			fmt.Fprintf(stdout, "ok       %s %s (%s)\n", r.Doc.Object.GetKind(), r.Doc.Object.GetName(), r.Doc.Source)
			continue
		}
		fmt.Fprintf(stdout, "INVALID  %s: %s\n", r.Doc.Source, manifest.Describe(r.Doc.Object, r.Errors))
	}
	for _, e := range res.SetErrors {
		fmt.Fprintf(stdout, "INVALID  %s\n", e)
	}
	if !res.OK() {
		return fmt.Errorf("%d of %d objects invalid, %d problems across objects", res.Invalid(), len(res.Objects), len(res.SetErrors))
	}
	fmt.Fprintf(stdout, "%d objects valid\n", len(res.Objects))
	return nil
}
