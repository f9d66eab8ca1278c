package cli

import (
	"fmt"
	"sort"

	"github.com/spf13/cobra"

	"liken.dev/liken/config/crd"
)

func newCRDs() *cobra.Command {
	return &cobra.Command{
		Use:     "crds",
		Short:   "print liken's CustomResourceDefinitions (kubectl apply -f -)",
		Example: "  liken crds | kubectl apply -f -",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			files, err := crd.Files()
			if err != nil {
				return err
			}
			var names []string
			for n := range files {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(cmd.OutOrStdout(), "---\n%s", files[n])
			}
			return nil
		},
	}
}
