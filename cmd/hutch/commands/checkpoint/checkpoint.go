// Package checkpoint holds `hutch checkpoint` (take, ls, rm, diff) and
// `hutch restore`: a sandbox's tree of checkpoints and going back to one.
package checkpoint

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Commands are `hutch checkpoint` and `hutch restore`.
var Commands = []*cli.Command{checkpointCommand, restoreCommand}

var checkpointCommand = &cli.Command{
	Name:  "checkpoint",
	Usage: "save a running sandbox's memory, processes and files as a checkpoint it can be restored to; prints its ID",
	Description: "Checkpoints form a tree: each one's parent is the checkpoint the sandbox was at (the last\n" +
		"one taken or restored). The sandbox keeps running. `hutch restore ID CHECKPOINT` goes back.",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "message", Aliases: []string{"m"}, Usage: "what the checkpoint is"},
		&cli.IntFlag{Name: "keep", Usage: "keep only the N newest checkpoints of the sandbox (the current one always)"},
		&cli.DurationFlag{Name: "max-age", Usage: "remove the sandbox's checkpoints older than this, e.g. 24h (the current one never)"},
	},
	Subcommands: []*cli.Command{lsCommand, rmCommand, diffCommand},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-m MESSAGE] [--keep N] ID")
		if err != nil {
			return err
		}
		if c.Int("keep") < 0 {
			return clix.UsageError(fmt.Errorf("--keep %d: want 0 (all) or more", c.Int("keep")))
		}
		if c.Duration("max-age") < 0 {
			return clix.UsageError(fmt.Errorf("--max-age %s: want a positive duration", c.Duration("max-age")))
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		info, err := e.Checkpoint(c.Context, a[0], engine.CheckpointRequest{
			Message: c.String("message"), Keep: c.Int("keep"), MaxAge: c.Duration("max-age"),
		})
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, info.ID)
		return nil
	},
}

var lsCommand = &cli.Command{
	Name:      "ls",
	Usage:     "draw a sandbox's checkpoint tree with times, sizes and messages (* is where it is)",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[--format json] ID")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		cks, err := e.Checkpoints(c.Context, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			if cks == nil {
				cks = []engine.CheckpointInfo{}
			}
			return clix.WriteJSON(c.App.Writer, cks)
		}
		writeTree(c.App.Writer, cks)
		return nil
	},
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "remove checkpoints of a sandbox; their children take their parent",
	ArgsUsage: "ID CHECKPOINT...",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 1<<16, "ID CHECKPOINT...")
		if err != nil {
			return err
		}
		for _, ck := range a[1:] {
			if err := engine.ValidCheckpointID(ck); err != nil {
				return clix.UsageError(err)
			}
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		for _, ck := range a[1:] {
			if err := e.RemoveCheckpoint(c.Context, a[0], ck); err != nil {
				return err
			}
		}
		return nil
	},
}

var diffCommand = &cli.Command{
	Name:  "diff",
	Usage: "list the files added (A), changed (M), deleted (D) and renamed (R) from checkpoint A to B (default: the sandbox now)",
	Description: "The same lines as `hutch diff`: KIND PATH, a / after directories, -> TARGET after symlinks,\n" +
		"(mode OLD -> NEW) when permissions changed; a rename is R OLD -> NEW.",
	ArgsUsage: "ID A [B|live]",
	Flags:     []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 3, "ID A [B|live]")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		b := engine.CheckpointLive
		if len(a) == 3 {
			b = a[2]
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		chs, err := e.DiffCheckpoints(c.Context, a[0], a[1], b)
		if err != nil {
			return err
		}
		if asJSON {
			if chs == nil {
				chs = []engine.CheckpointChange{}
			}
			return clix.WriteJSON(c.App.Writer, chs)
		}
		for _, ch := range chs {
			writeChange(c.App.Writer, ch)
		}
		return nil
	},
}

var restoreCommand = &cli.Command{
	Name:  "restore",
	Usage: "put a sandbox back at one of its checkpoints, in place (same ID, address, ports, tokens, volumes)",
	Description: "Its memory, processes and files become what they were at the checkpoint; connections into it\n" +
		"end. Works on a running or a paused sandbox, any number of times.",
	ArgsUsage: "ID CHECKPOINT",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "ID CHECKPOINT")
		if err != nil {
			return err
		}
		if err := engine.ValidCheckpointID(a[1]); err != nil {
			return clix.UsageError(err)
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		_, err = e.Restore(c.Context, a[0], a[1])
		return err
	},
}

func writeChange(w io.Writer, ch engine.CheckpointChange) {
	p := ch.Path
	switch ch.Type {
	case "dir":
		p += "/"
	case "symlink":
		if ch.Kind != engine.ChangeDeleted {
			p += " -> " + ch.Link
		}
	}
	if ch.Kind == engine.ChangeRenamed {
		p = ch.From + " -> " + p
	}
	note := ""
	if (ch.Kind == engine.ChangeModified || ch.Kind == engine.ChangeRenamed) && ch.OldMode != 0 && ch.Mode != ch.OldMode && ch.Type != "symlink" {
		note = fmt.Sprintf(" (mode %03o -> %03o)", ch.OldMode.Perm(), ch.Mode.Perm())
	}
	fmt.Fprintf(w, "%s %s%s\n", ch.Kind, p, note)
}

// writeTree draws the checkpoints as a tree, roots and children oldest
// first: ID, time, size (memory and files) and what it takes on disk of
// its own, message; * marks where the sandbox is.
func writeTree(w io.Writer, cks []engine.CheckpointInfo) {
	children := map[string][]engine.CheckpointInfo{}
	known := map[string]bool{}
	for _, c := range cks {
		known[c.ID] = true
	}
	var roots []engine.CheckpointInfo
	for _, c := range cks {
		if c.Parent == "" || !known[c.Parent] {
			roots = append(roots, c)
		} else {
			children[c.Parent] = append(children[c.Parent], c)
		}
	}
	var walk func(c engine.CheckpointInfo, prefix, branch string)
	walk = func(c engine.CheckpointInfo, prefix, branch string) {
		mark := " "
		if c.Current {
			mark = "*"
		}
		msg := strings.ReplaceAll(c.Message, "\n", " ")
		fmt.Fprintf(w, "%s %s%s%s  %s  %s (%s on disk)  %s\n", mark, prefix, branch, c.ID,
			c.Created.Local().Format("2006-01-02 15:04:05"), size(c.Size()), size(c.Disk), msg)
		kids := children[c.ID]
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, k := range kids {
			b := "├─ "
			if i == len(kids)-1 {
				b = "└─ "
			}
			walk(k, next, b)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
