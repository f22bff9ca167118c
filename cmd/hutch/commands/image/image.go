// Package image holds `hutch image`: the image store's commands.
package image

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Command is `hutch image`.
var Command = &cli.Command{
	Name:  "image",
	Usage: "manage images",
	Subcommands: []*cli.Command{
		buildCommand, lsCommand, rmCommand, pruneCommand, importCommand, exportCommand,
		pullCommand, pushCommand, shareCommand, unshareCommand,
	},
}

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list images",
	Flags:   []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		imgs, err := e.Images().List(c.Context)
		if err != nil {
			return err
		}
		if asJSON {
			if imgs == nil {
				imgs = []engine.Image{}
			}
			return clix.WriteJSON(c.App.Writer, imgs)
		}
		return clix.WriteTable(c.App.Writer, 3, []string{"NAME", "DIGEST", "SIZE", "SOURCE"}, imgs, func(img engine.Image) []string {
			src := img.Source
			if src == img.Name {
				src = "pull"
			} else if src == "" {
				src = "-"
			}
			return []string{img.Name, img.Digest.Encoded()[:12], engine.FormatSize(img.Size), src}
		})
	},
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "remove images (sandboxes using them keep running)",
	ArgsUsage: "NAME...",
	Action: func(c *cli.Context) error {
		names, err := clix.Args(c, 1, -1, "NAME...")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		for _, n := range names {
			name, err := engine.ParseImageName(n)
			if err != nil {
				return err
			}
			if err := e.RemoveImage(c.Context, name); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, name)
		}
		return nil
	},
}

var pruneCommand = &cli.Command{
	Name:  "prune",
	Usage: "remove unused layers, unpacked filesystems and cached setup results",
	Action: func(c *cli.Context) error {
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		n, err := e.PruneImages(c.Context)
		if err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "freed %s\n", engine.FormatSize(n))
		return nil
	},
}

var importCommand = &cli.Command{
	Name:      "import",
	Usage:     "import an OCI archive (- for stdin) as NAME",
	ArgsUsage: "NAME OCI_TAR",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "NAME OCI_TAR")
		if err != nil {
			return err
		}
		name, err := engine.ParseImageName(a[0])
		if err != nil {
			return err
		}
		var r io.Reader = c.App.Reader
		if a[1] != "-" {
			f, err := os.Open(a[1])
			if err != nil {
				return fmt.Errorf("archive: %w", err)
			}
			defer f.Close()
			r = f
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		img, err := e.Images().Import(c.Context, name, r)
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, img.Digest)
		return nil
	},
}

var exportCommand = &cli.Command{
	Name:      "export",
	Usage:     "write image NAME as an OCI archive (- for stdout)",
	ArgsUsage: "NAME OCI_TAR",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "NAME OCI_TAR")
		if err != nil {
			return err
		}
		name, err := engine.ParseImageName(a[0])
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if _, err := e.Images().Get(c.Context, name); err != nil {
			return err
		}
		if a[1] == "-" {
			return e.Images().Export(c.Context, name, c.App.Writer)
		}
		// Write beside the target and rename: a failed export leaves no
		// partial archive under the requested name.
		tmp, err := os.CreateTemp(filepath.Dir(a[1]), ".hutch-export-*")
		if err != nil {
			return fmt.Errorf("archive: %w", err)
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		if err := e.Images().Export(c.Context, name, tmp); err != nil {
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), a[1])
	},
}
