package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/screen"
)

var recordCommand = &cli.Command{
	Name:  "record",
	Usage: "record a desktop sandbox's screen to a video file (ffmpeg, H.264 in MP4)",
	Subcommands: []*cli.Command{
		{
			Name:      "start",
			Usage:     "start recording the screen; prints the recording's ID",
			ArgsUsage: "ID",
			Flags: []cli.Flag{
				&cli.IntFlag{Name: "fps", Value: 10, Usage: "frames a second, 1 to 30"},
			},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 1, 1, "ID")
				if err != nil {
					return err
				}
				fps := c.Int("fps")
				if fps < 1 || fps > 30 {
					return clix.UsageError(fmt.Errorf("--fps %d: want 1 to 30 frames a second", fps))
				}
				e, err := clix.Engine(c)
				if err != nil {
					return err
				}
				rec := screen.NewID()
				if _, err := recordRun(c.Context, e, a[0], screen.StartCommand(rec, fps)); err != nil {
					return err
				}
				fmt.Fprintln(c.App.Writer, rec)
				return nil
			},
		},
		{
			Name:      "stop",
			Usage:     "stop a recording; prints its file in the sandbox, or copies it to the host with -o",
			ArgsUsage: "ID RECORDING",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "copy the video to this host file"},
			},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 2, 2, "ID RECORDING")
				if err != nil {
					return err
				}
				if err := screen.CheckID(a[1]); err != nil {
					return clix.UsageError(err)
				}
				e, err := clix.Engine(c)
				if err != nil {
					return err
				}
				if _, err := recordRun(c.Context, e, a[0], screen.StopCommand(a[1])); err != nil {
					return err
				}
				file := screen.File(a[1])
				out := c.String("output")
				if out == "" {
					fmt.Fprintln(c.App.Writer, file)
					return nil
				}
				f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
				if err != nil {
					return clix.UsageError(fmt.Errorf("-o %s: %w", out, err))
				}
				err = e.ReadFile(c.Context, a[0], file, f)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					os.Remove(out)
					return clix.Exit(clix.ExitRuntime, err)
				}
				fmt.Fprintln(c.App.Writer, out)
				return nil
			},
		},
	},
}

// recordRun runs one of screen's commands in the sandbox and returns its
// output; a failure says what ffmpeg or the script said.
func recordRun(ctx context.Context, e *engine.Engine, ref string, args []string) (string, error) {
	var out, errb bytes.Buffer
	code, err := e.Exec(ctx, ref, engine.ExecRequest{Args: args, Stdout: &out, Stderr: &errb})
	msg := strings.TrimSpace(errb.String())
	switch {
	case err != nil:
		return "", clix.Exit(clix.ExitRuntime, err)
	case code == 3:
		return "", clix.UsageError(errors.New(msg))
	case code != 0:
		return "", clix.Exit(clix.ExitRuntime, fmt.Errorf("sandbox %s: %s", ref, msg))
	}
	return strings.TrimSpace(out.String()), nil
}
