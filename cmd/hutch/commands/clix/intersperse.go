package clix

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// Intersperse lets flags follow positional arguments, as in
// `hutch update ID --net open`: urfave/cli stops at the first positional
// argument, so the arguments of the command being run are reordered,
// flags first, using the command's own flag definitions to tell a
// flag's value from a positional argument. Everything from "--" on is
// left as it is, and so are commands that run a command line (ArgsUsage
// naming CMD): what follows their first argument is the command's own,
// as in `hutch exec ID ls -la`.
func Intersperse(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	// Global flags, then the command path.
	flags := app.Flags
	cmds := app.Commands
	var cmd *cli.Command
	for i < len(args) {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if isFlag(a) {
			out = append(out, a)
			if takesValue(flags, a) && i+1 < len(args) {
				out = append(out, args[i+1])
				i++
			}
			i++
			continue
		}
		next := findCommand(cmds, a)
		if next == nil {
			break
		}
		cmd = next
		out = append(out, a)
		flags, cmds = cmd.Flags, cmd.Subcommands
		i++
		if len(cmds) == 0 {
			break
		}
	}
	if cmd == nil || cmd.SkipFlagParsing || strings.Contains(cmd.ArgsUsage, "CMD") {
		return append(out, args[i:]...)
	}
	var fl, pos []string
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i:]...)
			break
		}
		if isFlag(a) {
			fl = append(fl, a)
			if takesValue(flags, a) && i+1 < len(args) {
				fl = append(fl, args[i+1])
				i++
			}
			continue
		}
		pos = append(pos, a)
	}
	out = append(out, fl...)
	return append(out, pos...)
}

func isFlag(a string) bool { return len(a) > 1 && a[0] == '-' && a != "-" }

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether flag token a (e.g. "--net", "-it", "--rm")
// consumes the next argument.
func takesValue(flags []cli.Flag, a string) bool {
	name := strings.TrimLeft(a, "-")
	if strings.Contains(name, "=") {
		return false
	}
	if !strings.HasPrefix(a, "--") && len(name) > 1 {
		// Combined short flags (-it): only the last may take a value.
		name = name[len(name)-1:]
	}
	for _, f := range flags {
		for _, n := range f.Names() {
			if n != name {
				continue
			}
			if _, ok := f.(*cli.BoolFlag); ok {
				return false
			}
			return true
		}
	}
	return false
}
