package cli

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Reference renders docs/reference/cli.md from the command tree, so the reference cannot
// say what the program does not do (a test fails when the file is stale).
func Reference() []byte {
	var b bytes.Buffer
	root := newRoot(io.Discard, io.Discard)
	fmt.Fprintf(&b, "# liken command line\n\nGenerated from the command tree by `make generate`; do not edit.\n\n%s\n", root.Long)
	fmt.Fprintln(&b, "\n| command | what it does |\n|---|---|")
	var all []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Parent().Name() == "completion" {
				continue
			}
			all = append(all, sub)
			walk(sub)
		}
	}
	walk(root)
	for _, c := range all {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s |\n", c.CommandPath(), anchor(c), strings.ReplaceAll(c.Short, "|", "\\|"))
	}
	for _, c := range all {
		fmt.Fprintf(&b, "\n## %s\n\n", c.CommandPath())
		if c.Long != "" {
			fmt.Fprintf(&b, "%s\n\n", c.Long)
		} else {
			fmt.Fprintf(&b, "%s.\n\n", strings.ToUpper(c.Short[:1])+c.Short[1:])
		}
		if c.Runnable() {
			fmt.Fprintf(&b, "```\n%s\n```\n\n", c.UseLine())
		}
		if c.HasAvailableSubCommands() {
			var subs []string
			for _, s := range c.Commands() {
				if s.IsAvailableCommand() {
					subs = append(subs, "`"+s.Name()+"`")
				}
			}
			fmt.Fprintf(&b, "Commands: %s.\n\n", strings.Join(subs, ", "))
		}
		if flags := c.LocalFlags().FlagUsages(); flags != "" {
			fmt.Fprintf(&b, "Flags:\n\n```\n%s```\n\n", flags)
		}
		if c.Example != "" {
			fmt.Fprintf(&b, "Examples:\n\n```sh\n%s\n```\n", c.Example)
		}
	}
	return b.Bytes()
}

func anchor(c *cobra.Command) string {
	return strings.ReplaceAll(strings.ToLower(c.CommandPath()), " ", "-")
}
