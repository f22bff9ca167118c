package sandbox

import (
	"errors"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var cpCommand = &cli.Command{
	Name:  "cp",
	Usage: "copy files between the host and a sandbox (recursive; modes, mtimes and symlinks kept)",
	Description: `SRC and DST are a host path or ID:PATH (PATH absolute, or relative to the
sandbox's working directory; ".." is refused). An existing directory as DST
receives SRC under its own name; otherwise DST is the copy's name. SRC
ending in /. copies a directory's contents. A host path with a colon
before its first slash is written ./NAME.`,
	ArgsUsage: "SRC DST",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "SRC DST (one of them ID:PATH)")
		if err != nil {
			return err
		}
		srcID, src, srcIn := splitSandboxPath(a[0])
		dstID, dst, dstIn := splitSandboxPath(a[1])
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		switch {
		case srcIn && dstIn:
			return clix.UsageError(errors.New("cp: copying from one sandbox to another is not supported: copy through the host"))
		case srcIn:
			return e.CopyFromSandbox(c.Context, srcID, src, dst)
		case dstIn:
			return e.CopyToSandbox(c.Context, dstID, src, dst)
		}
		return clix.UsageError(errors.New("cp: one of SRC and DST must be ID:PATH"))
	},
}

// splitSandboxPath splits "ID:PATH"; a colon after a slash is part of a
// host path.
func splitSandboxPath(s string) (id, path string, inSandbox bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

var psCommand = &cli.Command{
	Name:      "ps",
	Aliases:   []string{"top"},
	Usage:     "list the processes inside a sandbox (without ID: list sandboxes, as ls)",
	ArgsUsage: "[ID]",
	Flags:     []cli.Flag{clix.FormatFlag, &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "without ID: print sandbox IDs only"}},
	Action: func(c *cli.Context) error {
		if c.NArg() == 0 {
			return lsCommand.Action(c)
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		a, err := clix.Args(c, 1, 1, "[--format json] ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		ps, err := e.Processes(c.Context, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			if ps == nil {
				ps = []engine.Process{}
			}
			return clix.WriteJSON(c.App.Writer, ps)
		}
		return clix.WriteTable(c.App.Writer, 2, []string{"PID", "PPID", "UID", "TTY", "STIME", "TIME", "CMD"}, ps, func(p engine.Process) []string {
			return []string{strconv.Itoa(p.PID), strconv.Itoa(p.PPID), strconv.FormatUint(uint64(p.UID), 10), p.TTY, p.STime, p.Time, p.Cmd}
		})
	},
}
