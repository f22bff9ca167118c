package sandbox

import (
	"context"
	"fmt"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Create flags for the setup cache and the sandbox's lifetime.
var (
	setupFlag     = &cli.StringSliceFlag{Name: "setup", Usage: "shell command run once per image and command list; its result is cached (repeatable)"}
	lifetimeFlag  = &cli.DurationFlag{Name: "timeout", Usage: "the sandbox's lifetime, e.g. 30m; then --on-timeout happens"}
	onTimeoutFlag = &cli.StringFlag{Name: "on-timeout", Value: engine.OnTimeoutPause, Usage: "what happens when the lifetime ends: pause, stop or rm (a Docker sandbox's default: stop)"}
)

// persistRequest renders the setup and lifetime flags.
func persistRequest(c *cli.Context, req *engine.CreateRequest) {
	req.Setup = c.StringSlice("setup")
	req.Timeout = c.Duration("timeout")
	if c.IsSet("on-timeout") {
		req.OnTimeout = c.String("on-timeout")
	}
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
	Usage:     "make running copies of a running sandbox, or of one of its checkpoints (--from), with their memory, processes and filesystem; prints their IDs",
	ArgsUsage: "ID | --from CHECKPOINT [ID]",
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Value: 1, Usage: "number of copies"},
		&cli.StringFlag{Name: "from", Usage: "a checkpoint (hutch checkpoint) to branch from instead of the sandbox now"},
	},
	Action: func(c *cli.Context) error {
		from := c.String("from")
		minArgs := 1
		if from != "" {
			minArgs = 0
		}
		a, err := clix.Args(c, minArgs, 1, "[--count N] ID | --from CHECKPOINT [ID]")
		if err != nil {
			return err
		}
		if n := c.Int("count"); n < 1 {
			return clix.UsageError(fmt.Errorf("--count %d: want at least 1", n))
		}
		if from != "" {
			if err := engine.ValidCheckpointID(from); err != nil {
				return clix.UsageError(err)
			}
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		var sbs []*engine.Sandbox
		if from != "" {
			ref := ""
			if len(a) == 1 {
				ref = a[0]
			}
			sbs, err = e.ForkFrom(c.Context, ref, from, engine.ForkRequest{Count: c.Int("count")})
		} else {
			sbs, err = e.Fork(c.Context, a[0], engine.ForkRequest{Count: c.Int("count")})
		}
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
	Usage:     "print the output of a sandbox's init and background processes (exec -d), with timestamps, or its egress log (--egress)",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines"},
		&cli.BoolFlag{Name: "egress", Usage: "print the egress log: each web connection, its host and the decision on it"},
		clix.FormatFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[-f] [--egress [--format json]] ID")
		if err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		if c.Bool("egress") && c.Bool("follow") {
			return clix.UsageError(fmt.Errorf("--follow: not available with --egress"))
		}
		if !c.Bool("egress") && asJSON {
			return clix.UsageError(fmt.Errorf("--format json: only with --egress"))
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if c.Bool("egress") {
			return printEgressLog(c, e, a[0], asJSON)
		}
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return e.Logs(ctx, a[0], engine.LogsRequest{Out: c.App.Writer, Follow: c.Bool("follow")})
	},
}

// detachedCommand is a hidden command that hutch starts, detached, for work
// that outlives the command that needs it: it takes exactly the
// arguments usage names (n of them), ignores the terminal's signals and
// runs run with the engine of the global flags.
func detachedCommand(name, usage string, n int, run func(ctx context.Context, e *engine.Engine, args []string) error) *cli.Command {
	return &cli.Command{
		Name:      name,
		Hidden:    true,
		ArgsUsage: usage,
		Action: func(c *cli.Context) error {
			a, err := clix.Args(c, n, n, usage)
			if err != nil {
				return err
			}
			e, err := clix.Engine(c)
			if err != nil {
				return err
			}
			signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
			return run(context.Background(), e, a)
		},
	}
}

// watchdogCommand enforces a sandbox's lifetime.
var watchdogCommand = detachedCommand(clix.WatchdogCommandName, "ID", 1, func(ctx context.Context, e *engine.Engine, a []string) error {
	return e.RunWatchdog(ctx, a[0])
})

// finishPauseCommand ends a pause: it checksums the checkpoint and removes
// what is left of the paused sandbox's runtime.
var finishPauseCommand = detachedCommand(engine.FinishPauseCommand, "ID CHECKPOINT", 2, func(ctx context.Context, e *engine.Engine, a []string) error {
	return e.FinishPause(ctx, a[0], digest.Digest(a[1]))
})

// removeDroppedCommand deletes the files of checkpoints a resume or a fork
// no longer needs.
var removeDroppedCommand = detachedCommand(engine.RemoveDroppedCommand, "", 0, func(ctx context.Context, e *engine.Engine, _ []string) error {
	return e.RemoveDroppedCheckpoints(ctx)
})

// printEgressLog writes sandbox ref's egress log: a table, or the entries
// as JSON.
func printEgressLog(c *cli.Context, e *engine.Engine, ref string, asJSON bool) error {
	entries, err := e.EgressLog(c.Context, ref)
	if err != nil {
		return err
	}
	if asJSON {
		if entries == nil {
			entries = []engine.EgressEntry{}
		}
		return clix.WriteJSON(c.App.Writer, entries)
	}
	return clix.WriteTable(c.App.Writer, 2, []string{"TIME", "HOST", "PORT", "DECISION", "RULE OR REASON", "OUT", "IN", "DURATION"}, entries,
		func(x engine.EgressEntry) []string {
			why := x.Rule
			if x.Decision != "allow" || why == "" {
				why = x.Reason
			}
			if x.Error != "" {
				why += " (" + x.Error + ")"
			}
			host := x.Host
			if host == "" {
				host = "-"
			}
			if x.Method != "" {
				host += " " + x.Method + " " + x.Path
			}
			return []string{x.Time.Format(time.RFC3339), host, strconv.Itoa(int(x.Port)), x.Decision, why,
				strconv.FormatInt(x.BytesOut, 10), strconv.FormatInt(x.BytesIn, 10), (time.Duration(x.DurationMs) * time.Millisecond).String()}
		})
}

// removeCommand finishes a removal `hutch run --rm` began
// (engine.RemoveLater).
var removeCommand = detachedCommand(engine.RemoveCommand, "ID", 1, func(ctx context.Context, e *engine.Engine, a []string) error {
	return e.FinishRemove(ctx, a[0])
})

// storeCheckpointsCommand checksums and chunks a sandbox's checkpoints
// after a checkpoint or a restore returns.
var storeCheckpointsCommand = detachedCommand(engine.StoreCheckpointsCommand, "ID", 1, func(ctx context.Context, e *engine.Engine, a []string) error {
	return e.StoreCheckpoints(ctx, a[0])
})
