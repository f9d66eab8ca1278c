// Package report collects the figures tests and benchmarks measure, for `make test` to
// print at the end: each line is appended to the file LIKEN_TEST_REPORT names, or written
// to standard error when it names none.
package report

import (
	"fmt"
	"os"
)

// Line records one figure.
func Line(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	path := os.Getenv("LIKEN_TEST_REPORT")
	if path == "" {
		fmt.Fprintln(os.Stderr, line)
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, line)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}
