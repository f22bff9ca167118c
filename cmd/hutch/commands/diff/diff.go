// Package diff holds `hutch diff`: the changes of a sandbox's :overlay
// workspaces against their host directories, and copying them there.
package diff

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Command is `hutch diff`.
var Command = &cli.Command{
	Name:  "diff",
	Usage: "show (or --apply) the changes a sandbox made in its -v DIR:PATH:overlay workspaces",
	Description: "Lists added (A), changed (M) and deleted (D) paths of each overlay workspace, then a\n" +
		"unified diff of its text files. With PATH (a path in the sandbox), only what is at or\n" +
		"below it. --apply copies those changes to the host directory; nothing else ever writes it.",
	ArgsUsage: "ID [PATH]",
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "apply", Usage: "copy the changes to the host directory"},
		&cli.BoolFlag{Name: "name-status", Usage: "list the changed paths only, without the unified diff"},
		clix.FormatFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 2, "ID [PATH]")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		path := ""
		if len(a) == 2 {
			path = a[1]
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		var ds []engine.WorkspaceDiff
		if c.Bool("apply") {
			ds, err = e.ApplyDiff(c.Context, a[0], path)
		} else {
			ds, err = e.Diff(c.Context, a[0], path)
		}
		if err != nil {
			return err
		}
		if asJSON {
			return clix.WriteJSON(c.App.Writer, ds)
		}
		w := c.App.Writer
		for _, d := range ds {
			for _, ch := range d.Changes {
				writeChange(w, ch)
			}
		}
		if c.Bool("apply") || c.Bool("name-status") {
			return nil
		}
		for _, d := range ds {
			if err := d.WritePatch(w); err != nil {
				return err
			}
		}
		return nil
	},
}

func writeChange(w io.Writer, ch engine.Change) {
	p := ch.Path
	switch ch.Type {
	case "dir":
		p += "/"
	case "symlink":
		if ch.Kind != engine.ChangeDeleted {
			p += " -> " + ch.Link
		}
	}
	note := ""
	if ch.Kind == engine.ChangeModified && ch.Mode != ch.OldMode && ch.Type != "symlink" {
		note = fmt.Sprintf(" (mode %03o -> %03o)", ch.OldMode.Perm(), ch.Mode.Perm())
	}
	fmt.Fprintf(w, "%s %s%s\n", ch.Kind, p, note)
}
