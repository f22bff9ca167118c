package image

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var pullCommand = &cli.Command{
	Name:      "pull",
	Usage:     "fetch an image from a registry (python:3.12, ghcr.io/o/r:tag, HOST:PORT/r@sha256:...); prints its name",
	ArgsUsage: "REF",
	Flags:     []cli.Flag{clix.InsecureRegistryFlag, clix.CACertFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "REF")
		if err != nil {
			return err
		}
		if _, err := engine.ParseRegistryRef(a[0]); err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		img, err := clix.Pull(c, e, a[0])
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, img.Name)
		return nil
	},
}

var pushCommand = &cli.Command{
	Name:      "push",
	Usage:     "send image NAME to a registry as REF (HOST[:PORT]/REPO:TAG); prints the manifest digest",
	ArgsUsage: "NAME REF",
	Flags:     []cli.Flag{clix.InsecureRegistryFlag, clix.CACertFlag},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "NAME REF")
		if err != nil {
			return err
		}
		name, err := engine.ParseImageName(a[0])
		if err != nil {
			return err
		}
		if _, err := engine.ParseRegistryRef(a[1]); err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		reg, err := clix.RegistryOptions(c)
		if err != nil {
			return err
		}
		ch, wait := clix.RegistryProgress(c)
		desc, err := e.Push(ctx, engine.PushRequest{Image: name, Ref: a[1], Registry: reg, Status: ch})
		wait()
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, desc.Digest)
		return nil
	},
}
