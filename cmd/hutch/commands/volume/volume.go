// Package volume holds `hutch volume` (named volumes: create, ls, inspect,
// rm) and the parsing of create's and run's -v flag.
package volume

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Flag is -v/--volume of create and run.
var Flag = &cli.StringSliceFlag{
	Name: "volume", Aliases: []string{"v"},
	Usage: "mount SRC:PATH[:ro|:rw|:overlay], SRC a host directory or a named volume; :overlay: a copy-on-write view of a host directory (hutch diff) (repeatable)",
}

// Mounts parses the -v values into the engine's mounts. A host path
// starting with '.' is taken relative to the current directory.
func Mounts(vals []string) ([]engine.Mount, error) {
	var out []engine.Mount
	for _, s := range vals {
		m, err := engine.ParseMount(s)
		if err != nil {
			return nil, clix.UsageError(err)
		}
		if m.Source != "" && strings.HasPrefix(m.Source, ".") {
			if m.Source, err = filepath.Abs(m.Source); err != nil {
				return nil, clix.UsageError(fmt.Errorf("-v %q: %w", s, err))
			}
		}
		if m.Source != "" && !filepath.IsAbs(m.Source) {
			return nil, clix.UsageError(fmt.Errorf("-v %q: host directory %q is not an absolute path", s, m.Source))
		}
		out = append(out, m)
	}
	return out, nil
}

// Command is `hutch volume`.
var Command = &cli.Command{
	Name:        "volume",
	Usage:       "manage named volumes: directories that outlive sandboxes and can be shared between them",
	Subcommands: []*cli.Command{createCommand, lsCommand, inspectCommand, rmCommand},
}

var createCommand = &cli.Command{
	Name:      "create",
	Usage:     "create a named volume; prints its name",
	ArgsUsage: "NAME",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "NAME")
		if err != nil {
			return err
		}
		if err := engine.CheckVolumeName(a[0]); err != nil {
			return clix.UsageError(err)
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		v, err := e.CreateVolume(c.Context, a[0])
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, v.Name)
		return nil
	},
}

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list named volumes",
	Flags:   []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		if _, err := clix.Args(c, 0, 0, "[--format table|json]"); err != nil {
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
		vs, err := e.ListVolumes(c.Context)
		if err != nil {
			return err
		}
		if asJSON {
			if vs == nil {
				vs = []engine.Volume{}
			}
			return clix.WriteJSON(c.App.Writer, vs)
		}
		return clix.WriteTable(c.App.Writer, 2, []string{"NAME", "CREATED", "USED BY"}, vs, func(v engine.Volume) []string {
			return []string{v.Name, v.Created.Local().Format(time.DateTime), usedBy(v)}
		})
	},
}

func usedBy(v engine.Volume) string {
	if len(v.UsedBy) == 0 {
		return "-"
	}
	s := make([]string, len(v.UsedBy))
	for i, id := range v.UsedBy {
		s[i] = id[:min(12, len(id))]
	}
	return strings.Join(s, ",")
}

var inspectCommand = &cli.Command{
	Name:      "inspect",
	Usage:     "show a named volume as JSON: its host path and the sandboxes using it",
	ArgsUsage: "NAME",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "NAME")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		v, err := e.InspectVolume(c.Context, a[0])
		if err != nil {
			return err
		}
		return clix.WriteJSON(c.App.Writer, v)
	},
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Aliases:   []string{"remove"},
	Usage:     "remove named volumes and their files; refused while a sandbox uses one, unless -f",
	ArgsUsage: "NAME...",
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "remove even while sandboxes use it"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, -1, "[-f] NAME...")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		for _, name := range a {
			if err := e.RemoveVolume(c.Context, name, c.Bool("force")); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, name)
		}
		return nil
	},
}
