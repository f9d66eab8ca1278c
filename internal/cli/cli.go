// Package cli is the liken command line: one command tree (cobra and pflag, as kubectl and
// talosctl use), one file per subcommand, all reached through Run, which tests call
// in-process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

// Exit codes, as `liken help` documents them.
const (
	exitOK          = 0
	exitFailed      = 1 // the command ran and found a problem (invalid manifests, a failed download, ...)
	exitUsage       = 2 // the command line itself is wrong
	exitUnavailable = 3 // the subcommand is planned but not built yet
)

// errUsage marks an error in the command line itself.
var errUsage = errors.New("usage")

// errUnavailable marks a planned part of a command that is not built yet.
var errUnavailable = errors.New("not yet available")

// usageErr is an error in the command line, exit 2.
func usageErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// planned lists the commands that arrive with later issues: shown in help, refused with
// exit 3 until they are built.
var planned = []struct{ name, short, issue string }{}

// Run runs liken with args (without the program name) and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return execute(ctx, newRoot(stdout, stderr), args, stderr)
}

// execute runs the command tree on args and turns its error into a message and exit code.
func execute(ctx context.Context, root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	name := "liken"
	if cmd != nil {
		name = cmd.CommandPath()
	}
	msg := err.Error()
	switch {
	case errors.Is(err, errDiffers):
		return exitFailed
	case errors.Is(err, errDiffFailed):
		fmt.Fprintf(stderr, "%s: %s\n", name, strings.TrimPrefix(msg, errDiffFailed.Error()+": "))
		return exitDiffFailed
	case errors.Is(err, errUnavailable):
		fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		return exitUnavailable
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", name, strings.TrimPrefix(msg, errUsage.Error()+": "), name)
		return exitUsage
	case strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "unknown shorthand flag"):
		// cobra's own parse errors (the root's unknown subcommands).
		fmt.Fprintf(stderr, "%s: %s\nRun '%s --help' for usage.\n", name, msg, name)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "%s: %s\n", name, msg)
		return exitFailed
	}
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "liken",
		Short: "liken manages liken machines and their releases",
		Long: `liken manages liken machines: it checks Cluster and Machine manifests, builds the
deployment layers, builds, publishes, pins and verifies releases, installs machines, and
approves and requests their reboots.

Exit codes: 0 ok, 1 the command failed (invalid manifests, a failed download, ...),
2 the command line is wrong, 3 the command is planned but not built yet. diff exits 0
when it finds no difference and 1 when it finds some, as kubectl diff does, and 4 when it
fails.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Cobra would print its help and exit 0 for a bare "liken".
		Args: rejectUnknown,
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.Help()
			return usageErr("give a command")
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %v", errUsage, err) })
	root.AddCommand(newValidate(), newCRDs(), newLayer(), newRelease(), newInstall(), newInstaller(), newVersion(),
		newUpgrade(), newRollback(), newApproveReboot(), newRequestReboot(), newReleaseTurn(), newRollout(), newStatus(), newLogs(), newSupport(), newLab(), newDiff())
	for _, p := range planned {
		p := p
		root.AddCommand(&cobra.Command{
			Use:   p.name,
			Short: p.short + " [not yet available: " + p.issue + "]",
			Args:  cobra.ArbitraryArgs,
			// Whatever flags a later version takes are refused as "not yet available", not
			// as unknown.
			FParseErrWhitelist: cobra.FParseErrWhitelist{UnknownFlags: true},
			RunE: func(*cobra.Command, []string) error {
				return fmt.Errorf("%w: it arrives with issue %s", errUnavailable, p.issue)
			},
		})
	}
	// Cobra adds its completion command (bash, zsh, fish, powershell) when it runs; made
	// here, it answers an unknown shell like every other group.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Example = "  source <(liken completion bash)\n  liken completion zsh > \"${fpath[1]}/_liken\""
			group(c)
		}
	}
	return root
}

// group makes cmd a command that only holds subcommands: without one, or with one it does
// not know, it says so and lists them (cobra alone prints help and exits 0).
func group(cmd *cobra.Command, subs ...*cobra.Command) *cobra.Command {
	cmd.AddCommand(subs...)
	cmd.Args = rejectUnknown
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return usageErr("give one of its commands: %s", strings.Join(subNames(cmd), ", "))
	}
	return cmd
}

// rejectUnknown refuses an argument that names no subcommand, listing the real ones.
func rejectUnknown(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return usageErr("unknown command %q; its commands are: %s", args[0], strings.Join(subNames(cmd), ", "))
}

func subNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

// noArgs, exactArgs and minArgs check positional arguments and name the extra ones.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErr("unexpected argument %q: %s takes flags only", args[0], cmd.CommandPath())
	}
	return nil
}

func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < n:
			return usageErr("give %s", what)
		case len(args) > n:
			return usageErr("unexpected argument %q: give only %s", args[n], what)
		}
		return nil
	}
}

func minArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usageErr("give %s", what)
		}
		return nil
	}
}

// output is the -o flag of a command that prints a result.
type output struct{ format string }

func (o *output) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "", "print the result as json or yaml instead of text")
}

func (o *output) check() error {
	switch o.format {
	case "", "json", "yaml":
		return nil
	}
	return usageErr("--output %q: give json or yaml", o.format)
}

// print writes v as JSON or YAML when -o asks for it, else calls text.
func (o *output) print(w io.Writer, v any, text func(io.Writer)) error {
	switch o.format {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding the result: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding the result: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	text(w)
	return nil
}
