package cli

import (
	"context"
	"fmt"
	"io"
	"sort"

	"liken.dev/liken/config/crd"
)

func runCRDs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: crds takes no arguments", errUsage)
	}
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
		fmt.Fprintf(stdout, "---\n%s", files[n])
	}
	return nil
}
