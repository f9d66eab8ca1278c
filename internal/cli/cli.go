// Package cli is the liken command line: one file per subcommand, all reached through Run,
// which tests call in-process.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1 // the command ran and found a problem (invalid manifests, ...)
	exitUsage       = 2 // bad arguments
	exitUnavailable = 3 // the subcommand is planned but not built yet
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	// issue names the issue that delivers a planned command; empty when it is available.
	issue string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands lists every subcommand liken has or will have, in the order --help shows them.
var commands = []command{
	{name: "validate", summary: "check Cluster and Machine manifests with the API's own rules", run: runValidate},
	{name: "crds", summary: "print liken's CustomResourceDefinitions (kubectl apply -f -)", run: runCRDs},
	{name: "layer", summary: "build the deployment layers from a Cluster and Machine manifests", run: runLayer},
	{name: "release", summary: "build, publish, pin and verify releases (build|publish|pin|verify)", run: runRelease},
	{name: "install", summary: "write a release and a layer to a disk or disk image", run: runInstall},
	{name: "status", summary: "show the fleet: versions, pending changes, reboot turns", issue: "reboot coordination"},
	{name: "upgrade", summary: "set the Cluster's spec.version to a pinned release", issue: "reboot coordination"},
	{name: "rollback", summary: "move the fleet or one machine back to an earlier pinned release", issue: "reboot coordination"},
	{name: "approve-reboot", summary: "approve a machine's staged reboot", issue: "reboot coordination"},
	{name: "request-reboot", summary: "ask a machine to reboot when nothing changed", issue: "reboot coordination"},
	{name: "lab", summary: "run a cluster of QEMU machines on this host", issue: "lab"},
}

// errUsage marks an error in the command line itself.
var errUsage = errors.New("usage")

// errUnavailable marks a planned part of a command that is not built yet.
var errUnavailable = errors.New("not yet available")

// Run runs liken with args (without the program name) and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		if c.run == nil {
			fmt.Fprintf(stderr, "liken %s: not yet available: it arrives with issue %s\n", c.name, c.issue)
			return exitUnavailable
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, errUnavailable):
			fmt.Fprintf(stderr, "liken %s: %v\n", c.name, err)
			return exitUnavailable
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "liken %s: %v\n", c.name, err)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "liken %s: %v\n", c.name, err)
			return exitFailed
		}
	}
	fmt.Fprintf(stderr, "liken: unknown command %q; see liken --help\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "liken manages liken machines. Usage: liken COMMAND [ARGS]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands {
		line := fmt.Sprintf("  %-15s %s", c.name, c.summary)
		if c.run == nil {
			line += " [not yet available: " + c.issue + "]"
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run liken COMMAND --help for a command's flags.")
}
