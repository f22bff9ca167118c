package image

import (
	"context"
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
		&cli.StringFlag{Name: "start-cmd", Usage: "make the image a template: a shell command started in every sandbox of it, whose ready moment is captured with memory once, so that its sandboxes start with it running (label " + engine.LabelStart + ")"},
		&cli.StringFlag{Name: "ready-cmd", Usage: "when the template's start command is ready: port:PORT, url:http://127.0.0.1:PORT/PATH, file:PATH, time:DURATION, or a shell command that exits 0 (label " + engine.LabelReady + "; default time:1s)"},
		&cli.DurationFlag{Name: "ready-timeout", Usage: "how long the ready check may take to pass (default " + engine.DefaultReadyTimeout.String() + "; label " + engine.LabelReadyTimeout + ")"},
		&cli.StringSliceFlag{Name: "allow", Usage: "give RUN steps a network that reaches only HOST|CIDR[:PORT] (repeatable, as create's --allow; default none: steps have no network); steps with one trust the host's CA certificates"},
		&cli.StringSliceFlag{Name: "dns", Usage: "with --allow: an upstream DNS server for the steps' resolver (repeatable; default the host's)"},
		clix.ProgressFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-t NAME] [-f DOCKERFILE] [--build-arg K=V]... [--allow RULE]... CONTEXT")
		if err != nil {
			return err
		}
		req := engine.BuildRequest{ContextDir: a[0], Dockerfile: c.String("file"), Allow: c.StringSlice("allow"), DNS: c.StringSlice("dns")}
		if err := engine.ParseBuildAllow(req.Allow, req.DNS); err != nil {
			return clix.UsageError(err)
		}
		if t := c.String("tag"); t != "" {
			if req.Tag, err = engine.ParseImageName(t); err != nil {
				return err
			}
		}
		if req.BuildArgs, err = clix.KeyValues("build-arg", c.StringSlice("build-arg")); err != nil {
			return err
		}
		if req.Labels, err = templateLabels(c, req.Tag); err != nil {
			return clix.UsageError(err)
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
		if t, err := engine.TemplateOf(img); err != nil {
			return err
		} else if t != nil {
			how := "to capture it with memory"
			if img.Config.Config.Labels[engine.LabelDocker] == "true" {
				how = "once, to check it (a Docker sandbox starts it cold)"
			}
			fmt.Fprintf(c.App.ErrWriter, "template %s: starting %q until %s, %s\n", req.Tag, t.Start, t.Ready, how)
			if _, err := e.BuildTemplate(ctx, req.Tag); err != nil {
				// A template that never gets ready is no image to
				// start sandboxes from.
				if rerr := e.RemoveImage(context.WithoutCancel(ctx), req.Tag); rerr != nil {
					return fmt.Errorf("%w (and removing the image: %v)", err, rerr)
				}
				return fmt.Errorf("%w\nthe image %s is not kept", err, req.Tag)
			}
		}
		fmt.Fprintln(c.App.Writer, img.Digest)
		return nil
	},
}

// templateLabels are the labels the template flags ask for; a ready
// check or timeout without a start command, a bad check, or a template
// without a name is an error.
func templateLabels(c *cli.Context, tag string) (map[string]string, error) {
	start, ready, timeout := c.String("start-cmd"), c.String("ready-cmd"), c.Duration("ready-timeout")
	if start == "" {
		if ready != "" || c.IsSet("ready-timeout") {
			return nil, fmt.Errorf("--ready-cmd and --ready-timeout say when a template's --start-cmd is ready: give --start-cmd too")
		}
		return nil, nil
	}
	if tag == "" {
		return nil, fmt.Errorf("--start-cmd makes a template, which needs a name: give -t NAME")
	}
	labels := map[string]string{engine.LabelStart: start}
	if ready != "" {
		if _, err := engine.ParseReadyCheck(ready); err != nil {
			return nil, fmt.Errorf("--ready-cmd: %w", err)
		}
		labels[engine.LabelReady] = ready
	}
	if c.IsSet("ready-timeout") {
		if timeout <= 0 {
			return nil, fmt.Errorf("--ready-timeout %s: want a positive duration", timeout)
		}
		labels[engine.LabelReadyTimeout] = timeout.String()
	}
	return labels, nil
}
