// Command apidoc prints docs/reference/api.md (see internal/apidoc); `make generate` runs it.
package main

import (
	"fmt"
	"os"

	"liken.dev/liken/internal/apidoc"
)

func main() {
	b, err := apidoc.Render()
	if err != nil {
		fmt.Fprintln(os.Stderr, "apidoc:", err)
		os.Exit(1)
	}
	os.Stdout.Write(b)
}
