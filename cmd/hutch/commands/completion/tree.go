// Package completion is `hutch completion bash|zsh|fish` and `hutch man`:
// shell completions and the manual page, made from the CLI's own
// definitions of its commands and flags so that they cannot drift from
// them. It only reads the app it is given.
package completion

import (
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
)

// Node is one command of the CLI (the app itself at the root) as the
// completions and the manual see it: hidden commands and flags left out,
// help added where urfave/cli adds it.
type Node struct {
	// Path is the command names from the root: empty at the root.
	Path    []string
	Name    string
	Aliases []string
	Usage   string
	// ArgsUsage and Description are the command's own texts.
	ArgsUsage   string
	Description string
	Flags       []Flag
	Subs        []*Node
}

// Flag is a flag of a command.
type Flag struct {
	// Names are the flag's names without dashes: long ones (two or more
	// letters) take --, one letter takes -.
	Names      []string
	Usage      string
	TakesValue bool
	EnvVars    []string
	Default    string
}

// Spellings are the flag as typed: --name for long names, -n for short.
func (f Flag) Spellings() []string {
	out := make([]string, len(f.Names))
	for i, n := range f.Names {
		if len(n) == 1 {
			out[i] = "-" + n
		} else {
			out[i] = "--" + n
		}
	}
	return out
}

// helpFlag is the --help, -h every command has.
var helpFlag = Flag{Names: []string{"help", "h"}, Usage: "show help"}

// Tree is app's commands and flags.
func Tree(app *cli.App) *Node {
	root := &Node{Name: app.Name, Usage: app.Usage, Description: app.Description, Flags: flags(app.Flags)}
	if !app.HideVersion && cli.VersionFlag != nil && !hasFlag(root.Flags, cli.VersionFlag.Names()[0]) {
		root.Flags = append(root.Flags, flag(cli.VersionFlag))
	}
	root.Subs = commands(nil, app.Commands)
	if !app.HideHelpCommand && !has(root.Subs, "help") {
		root.Subs = append(root.Subs, &Node{Path: []string{"help"}, Name: "help", Aliases: []string{"h"}, Usage: "show a list of commands or help for one command", ArgsUsage: "[COMMAND]", Flags: []Flag{helpFlag}})
	}
	return root
}

func hasFlag(flags []Flag, name string) bool {
	for _, f := range flags {
		if f.Names[0] == name {
			return true
		}
	}
	return false
}

func has(nodes []*Node, name string) bool {
	for _, n := range nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

func commands(parent []string, cmds []*cli.Command) []*Node {
	var out []*Node
	for _, c := range cmds {
		// urfave/cli adds a help subcommand to a command it runs: only
		// the root's help is offered.
		if c.Hidden || (c.Name == "help" && len(parent) > 0) {
			continue
		}
		path := append(append([]string{}, parent...), c.Name)
		n := &Node{Path: path, Name: c.Name, Aliases: c.Aliases, Usage: c.Usage, ArgsUsage: c.ArgsUsage, Description: c.Description, Flags: flags(c.Flags)}
		n.Subs = commands(path, c.Subcommands)
		out = append(out, n)
	}
	return out
}

func flags(fs []cli.Flag) []Flag {
	var out []Flag
	seenHelp := false
	for _, f := range fs {
		if v, ok := f.(cli.VisibleFlag); ok && !v.IsVisible() {
			continue
		}
		fl := flag(f)
		if hasFlag(out, fl.Names[0]) {
			continue // urfave/cli adds --help and --version to what it runs
		}
		if fl.Names[0] == "help" {
			seenHelp = true
		}
		out = append(out, fl)
	}
	if !seenHelp {
		out = append(out, helpFlag)
	}
	return out
}

func flag(f cli.Flag) Flag {
	fl := Flag{Names: f.Names()}
	if d, ok := f.(cli.DocGenerationFlag); ok {
		fl.Usage = d.GetUsage()
		fl.TakesValue = d.TakesValue()
		fl.EnvVars = d.GetEnvVars()
		fl.Default = d.GetDefaultText()
		if fl.Default == "" && fl.TakesValue {
			fl.Default = d.GetValue()
		}
	}
	if _, ok := f.(*cli.BoolFlag); ok {
		fl.TakesValue = false
		fl.Default = ""
	}
	return fl
}

// Walk calls fn on n and every command below it, parents first.
func (n *Node) Walk(fn func(*Node)) {
	fn(n)
	for _, s := range n.Subs {
		s.Walk(fn)
	}
}

// Key is the command's path joined by spaces: "" at the root.
func (n *Node) Key() string { return strings.Join(n.Path, " ") }

// SubNames are the names and aliases of the commands below n, sorted.
func (n *Node) SubNames() []string {
	var out []string
	for _, s := range n.Subs {
		out = append(out, s.Name)
		out = append(out, s.Aliases...)
	}
	sort.Strings(out)
	return out
}

// FlagSpellings are n's flags as typed, sorted; valued ones only if
// valued is set.
func (n *Node) FlagSpellings(valuedOnly bool) []string {
	var out []string
	for _, f := range n.Flags {
		if valuedOnly && !f.TakesValue {
			continue
		}
		out = append(out, f.Spellings()...)
	}
	sort.Strings(out)
	return out
}
