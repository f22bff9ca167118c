package image

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
)

var shareCommand = &cli.Command{
	Name:      "share",
	Usage:     "publish images in the shared image store, for every user of this host (root)",
	ArgsUsage: "NAME...",
	Description: "Unprivileged users' sandboxes find shared images after their own: the first\n" +
		"use copies one into the user's store. The store is $HUTCH_SHARED_IMAGES, else /var/lib/hutch-images;\n" +
		"only its OCI layout is readable by others.",
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
			img, err := e.ShareImage(c.Context, n)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "%s %s\n", img.Name, e.SharedImages())
		}
		return nil
	},
}

var unshareCommand = &cli.Command{
	Name:      "unshare",
	Usage:     "remove images from the shared image store (root; users keep their copies)",
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
			if err := e.UnshareImage(c.Context, n); err != nil {
				return err
			}
		}
		return nil
	},
}
