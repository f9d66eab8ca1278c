package cli

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"liken.dev/liken/internal/manifest"
)

// validated is validate's result, as -o prints it.
type validated struct {
	Objects   []validatedObject `json:"objects"`
	SetErrors []string          `json:"setErrors,omitempty"`
	// Unreadable are the files that could not be read or parsed.
	Unreadable []string `json:"unreadable,omitempty"`
	Valid      bool     `json:"valid"`
}

type validatedObject struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Source string `json:"source"`
	Error  string `json:"error,omitempty"`
}

func newValidate() *cobra.Command {
	var o output
	var clusterFile string
	cmd := &cobra.Command{
		Use:   "validate PATH...",
		Short: "check Cluster and Machine manifests with the API's own rules",
		Long: `Checks every Cluster and Machine in the files or directories given, with the schema,
defaults and rules the Kubernetes API server applies to them, and the rules across
objects (one Cluster, distinct names and hardware matches). A file named twice, or both
alone and through its directory, is checked once; "-" is standard input. A file that
cannot be read is reported and the others are still checked.`,
		Example: `  liken validate docs/examples
  liken validate cluster.yaml machines/ -o json
  liken validate --cluster cluster.yaml machines/worker-7.yaml
  kubectl get machine worker-7 -o yaml | liken validate --cluster cluster.yaml -`,
		Args: minArgs(1, "at least one file or directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(); err != nil {
				return err
			}
			v, err := manifest.NewValidator()
			if err != nil {
				return err
			}
			paths := args
			if clusterFile != "" {
				paths = append([]string{clusterFile}, args...)
			}
			read, err := readManifests(cmd.InOrStdin(), paths...)
			if err != nil {
				return err
			}
			res := manifest.CheckSet(v, read.docs)
			out := validated{Valid: res.OK() && len(read.failed) == 0, Unreadable: read.failed}
			for _, r := range res.Objects {
				vo := validatedObject{Kind: r.Doc.Object.GetKind(), Name: r.Doc.Object.GetName(), Source: r.Doc.Source}
				if len(r.Errors) > 0 {
					vo.Error = manifest.Describe(r.Doc.Object, r.Errors)
				}
				out.Objects = append(out.Objects, vo)
			}
			for _, e := range res.SetErrors {
				out.SetErrors = append(out.SetErrors, e)
			}
			err = o.print(cmd.OutOrStdout(), out, func(w io.Writer) {
				for _, r := range out.Objects {
					if r.Error == "" {
						fmt.Fprintf(w, "ok       %s %s (%s)\n", r.Kind, r.Name, r.Source)
					} else {
						fmt.Fprintf(w, "INVALID  %s: %s\n", r.Source, r.Error)
					}
				}
				for _, e := range out.SetErrors {
					fmt.Fprintf(w, "INVALID  %s\n", e)
				}
				for _, e := range out.Unreadable {
					fmt.Fprintf(w, "UNREADABLE  %s\n", e)
				}
				if out.Valid {
					fmt.Fprintf(w, "%d objects valid\n", len(res.Objects))
				}
			})
			if err != nil {
				return err
			}
			if !out.Valid {
				return fmt.Errorf("%d of %d objects invalid, %d problems across objects, %d files unreadable", res.Invalid(), len(res.Objects), len(res.SetErrors), len(read.failed))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&clusterFile, "cluster", "", "the Cluster manifest to check Machines against")
	o.add(cmd)
	return cmd
}

// manifests reads the manifests in paths ("-" is standard input), each file once however
// often it is named. A file that cannot be read or parsed is reported in failed and the
// others are still read, so one broken file does not hide the state of the rest.
type manifests struct {
	docs   []manifest.Document
	failed []string
}

func readManifests(stdin io.Reader, paths ...string) (manifests, error) {
	var m manifests
	seen := map[string]bool{}
	for _, p := range paths {
		if p == "-" {
			if seen["-"] {
				continue
			}
			seen["-"] = true
			b, err := io.ReadAll(stdin)
			if err != nil {
				return m, fmt.Errorf("reading standard input: %w", err)
			}
			d, err := manifest.Parse("(stdin)", b)
			if err != nil {
				m.failed = append(m.failed, err.Error())
			}
			m.docs = append(m.docs, d...)
			continue
		}
		files, err := manifest.Files(p)
		if err != nil {
			return m, err
		}
		for _, f := range files {
			abs, _ := filepath.Abs(f)
			if seen[abs] {
				continue
			}
			seen[abs] = true
			d, err := manifest.LoadFile(f)
			if err != nil {
				m.failed = append(m.failed, err.Error())
				continue
			}
			m.docs = append(m.docs, d...)
		}
	}
	return m, nil
}

// loadAll is readManifests for commands that need every file to be readable.
func loadAll(stdin io.Reader, paths ...string) ([]manifest.Document, error) {
	m, err := readManifests(stdin, paths...)
	if err != nil {
		return nil, err
	}
	if len(m.failed) > 0 {
		return nil, errors.New(strings.Join(m.failed, "; "))
	}
	return m.docs, nil
}
