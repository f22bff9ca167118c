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

var buildCommand = &cli.Command{
	Name:      "build",
	Usage:     "build an image from a Dockerfile with BuildKit; RUN steps run under gVisor",
	ArgsUsage: "CONTEXT",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "tag", Aliases: []string{"t"}, Usage: "name of the image (without it the result stays only in the build cache)"},
		&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "Dockerfile (default CONTEXT/Dockerfile)"},
		&cli.StringSliceFlag{Name: "build-arg", Usage: "Dockerfile ARG value KEY=VALUE"},
		clix.ProgressFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-t NAME] [-f DOCKERFILE] [--build-arg K=V]... CONTEXT")
		if err != nil {
			return err
		}
		req := engine.BuildRequest{ContextDir: a[0], Dockerfile: c.String("file")}
		if t := c.String("tag"); t != "" {
			if req.Tag, err = engine.ParseImageName(t); err != nil {
				return err
			}
		}
		if req.BuildArgs, err = clix.KeyValues("build-arg", c.StringSlice("build-arg")); err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		ch, wait, err := clix.Progress(c, c.App.ErrWriter)
		if err != nil {
			return err
		}
		req.Status = ch
		ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
		defer stop()
		img, err := e.Build(ctx, req)
		wait()
		if err != nil {
			return err
		}
		if req.Tag == "" {
			fmt.Fprintln(c.App.ErrWriter, "built; no -t given, so the result is only in the build cache")
			return nil
		}
		fmt.Fprintln(c.App.Writer, img.Digest)
		return nil
	},
}
