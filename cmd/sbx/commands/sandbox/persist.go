package sandbox

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"

	"github.com/opencontainers/go-digest"
	"github.com/urfave/cli/v2"

	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/engine"
)

// Create flags for the setup cache and the sandbox's lifetime.
var (
	setupFlag     = &cli.StringSliceFlag{Name: "setup", Usage: "shell command run once per image and command list; its result is cached (repeatable)"}
	lifetimeFlag  = &cli.DurationFlag{Name: "timeout", Usage: "the sandbox's lifetime, e.g. 30m; then --on-timeout happens"}
	onTimeoutFlag = &cli.StringFlag{Name: "on-timeout", Value: engine.OnTimeoutPause, Usage: "what happens when the lifetime ends: pause, stop or rm"}
)

// persistRequest renders the setup and lifetime flags.
func persistRequest(c *cli.Context, req *engine.CreateRequest) {
	req.Setup = c.StringSlice("setup")
	req.Timeout = c.Duration("timeout")
	req.OnTimeout = c.String("on-timeout")
}

var snapshotCommand = &cli.Command{
	Name:      "snapshot",
	Usage:     "save a sandbox's filesystem changes as an image (its image plus one layer); prints the image name",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{&cli.StringFlag{Name: "tag", Aliases: []string{"t"}, Usage: "image name (default snapshot/<ID>:<time>)"}},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-t NAME] ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		img, err := e.Snapshot(c.Context, a[0], engine.SnapshotRequest{Name: c.String("tag")})
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, img.Name)
		return nil
	},
}

var pauseCommand = &cli.Command{
	Name:      "pause",
	Usage:     "checkpoint sandboxes' memory and filesystem to disk and stop their processes",
	ArgsUsage: "ID...",
	Action: forEachID(func(c *cli.Context, e *engine.Engine, id string) error {
		_, err := e.Pause(c.Context, id)
		return err
	}),
}

var resumeCommand = &cli.Command{
	Name:      "resume",
	Usage:     "restore paused sandboxes; their processes continue",
	ArgsUsage: "ID...",
	Action: forEachID(func(c *cli.Context, e *engine.Engine, id string) error {
		_, err := e.Resume(c.Context, id)
		return err
	}),
}

var forkCommand = &cli.Command{
	Name:      "fork",
	Usage:     "make running copies of a running sandbox (memory, processes, filesystem); prints their IDs",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Value: 1, Usage: "number of copies"}},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[--count N] ID")
		if err != nil {
			return err
		}
		if n := c.Int("count"); n < 1 {
			return clix.UsageError(fmt.Errorf("--count %d: want at least 1", n))
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		sbs, err := e.Fork(c.Context, a[0], engine.ForkRequest{Count: c.Int("count")})
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			fmt.Fprintln(c.App.Writer, sb.ID)
		}
		return nil
	},
}

var logsCommand = &cli.Command{
	Name:      "logs",
	Usage:     "print the output of a sandbox's init and background processes (exec -d), with timestamps",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines"}},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-f] ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return e.Logs(ctx, a[0], engine.LogsRequest{Out: c.App.Writer, Follow: c.Bool("follow")})
	},
}

// watchdogCommand is started by sbx itself, detached, for a sandbox with a
// lifetime.
var watchdogCommand = &cli.Command{
	Name:      clix.WatchdogCommandName,
	Hidden:    true,
	ArgsUsage: "ID",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
		return e.RunWatchdog(context.Background(), a[0])
	},
}

// finishPauseCommand is started by the engine, detached, at the end of a
// pause, to remove what is left of the paused sandbox's runtime.
var finishPauseCommand = &cli.Command{
	Name:      engine.FinishPauseCommand,
	Hidden:    true,
	ArgsUsage: "ID CHECKPOINT",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, 2, "ID CHECKPOINT")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
		return e.FinishPause(context.Background(), a[0], digest.Digest(a[1]))
	},
}

// removeDroppedCommand is started by the engine, detached, to delete the
// files of checkpoints a resume or a fork no longer needs.
var removeDroppedCommand = &cli.Command{
	Name:   engine.RemoveDroppedCommand,
	Hidden: true,
	Action: func(c *cli.Context) error {
		if _, err := clix.Args(c, 0, 0, ""); err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
		return e.RemoveDroppedCheckpoints(context.Background())
	},
}
