// Command clidoc prints docs/reference/cli.md (see internal/cli.Reference); `make generate`
// runs it.
package main

import (
	"os"

	"liken.dev/liken/internal/cli"
)

func main() { os.Stdout.Write(cli.Reference()) }
