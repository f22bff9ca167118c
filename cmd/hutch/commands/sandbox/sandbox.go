// Package sandbox holds the sandbox commands: create, run, exec, ls,
// inspect, stop, rm.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/cmd/hutch/commands/volume"
	"hutch.dev/hutch/engine"
)

// Commands are the sandbox commands, top-level verbs of hutch.
var Commands = []*cli.Command{
	createCommand, runCommand, execCommand, lsCommand, inspectCommand, stopCommand, rmCommand,
	updateCommand, statsCommand, shellCommand, cpCommand, psCommand, portForwardCommand,
	// persist.go
	snapshotCommand, pauseCommand, resumeCommand, forkCommand, logsCommand, watchdogCommand, finishPauseCommand,
	removeDroppedCommand, storeCheckpointsCommand, removeCommand,
	// code.go
	codeCommand, codeContextCommand,
	// browser.go
	browserCommand, recordCommand,
}

var createFlags = []cli.Flag{
	&cli.StringFlag{Name: "name", Usage: "a unique name for the sandbox"},
	&cli.StringFlag{Name: "image", Usage: "image to run: a name in the store or a registry reference (default " + engine.DefaultImage + ")"},
	clix.PullFlag, clix.InsecureRegistryFlag, clix.CACertFlag,
	&cli.StringFlag{Name: "cpus", Usage: "CPU limit, in cores (default 2)"},
	&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 512m, 2g (default 2g)"},
	&cli.StringFlag{Name: "pids", Usage: "process limit (default 1024)"},
	&cli.StringFlag{Name: "disk", Usage: "writable layer size, e.g. 1g (default 10g)"},
	&cli.StringFlag{Name: "net", Value: "none", Usage: "network mode: none (loopback only), open (anything but private, link-local and host addresses), allow (only --allow)"},
	&cli.StringSliceFlag{Name: "allow", Usage: "allow egress to CIDR[:PORT], IP[:PORT], DOMAIN[:PORT] or *.DOMAIN[:PORT]"},
	&cli.StringSliceFlag{Name: "inject", Usage: "HOST:HEADER=VALUE or HOST:env=VAR=VALUE, VALUE secret:NAME or holding ${secret:NAME}: the egress gateway sets the header (or replaces VAR's placeholder) in requests to HOST with the host's secret (hutch secret add); needs --net allow (repeatable)"},
	&cli.StringSliceFlag{Name: "dns", Usage: "upstream DNS server for the sandbox's resolver (default: the host's)"},
	&cli.StringFlag{Name: "net-rate", Usage: "limit what the sandbox sends, e.g. 10mbit, 1gbit (default unlimited; as root)"},
	&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "environment KEY=VALUE for every process"},
	&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory of commands"},
	&cli.StringSliceFlag{Name: "label", Usage: "label KEY=VALUE"},
	&cli.StringSliceFlag{Name: "secret", Usage: "secret NAME=@FILE or NAME=env:VAR: in every command's environment and in /run/secrets/NAME"},
	publishFlag, volume.Flag, clix.DockerFlag,
	// persist.go
	setupFlag, lifetimeFlag, onTimeoutFlag,
}

// createRequest renders the create flags.
func createRequest(c *cli.Context) (engine.CreateRequest, error) {
	req := engine.CreateRequest{
		Name: c.String("name"), Image: c.String("image"), Network: c.String("net"),
		Allow: c.StringSlice("allow"), DNS: c.StringSlice("dns"), Inject: c.StringSlice("inject"),
		Env: c.StringSlice("env"), Workdir: c.String("workdir"),
		Secrets: c.StringSlice("secret"), Docker: c.Bool("docker"),
	}
	var err error
	if r := c.String("net-rate"); r != "" {
		if req.NetRate, err = engine.ParseRate(r); err != nil {
			return req, clix.UsageError(fmt.Errorf("--net-rate: %w", err))
		}
	}
	if req.CACerts, err = clix.CACerts(c); err != nil {
		return req, err
	}
	if req.Labels, err = clix.KeyValues("label", c.StringSlice("label")); err != nil {
		return req, err
	}
	if req.Ports, err = portMappings(c.StringSlice("publish")); err != nil {
		return req, err
	}
	if req.Mounts, err = volume.Mounts(c.StringSlice("volume")); err != nil {
		return req, err
	}
	persistRequest(c, &req)
	return req, clix.Limits(c, &req)
}

var createCommand = &cli.Command{
	Name:      "create",
	Usage:     "create and start a sandbox; prints its ID",
	ArgsUsage: " ",
	Flags:     createFlags,
	Action: func(c *cli.Context) error {
		// A signal at any step aborts the create, which leaves nothing.
		in := catchSignals(c.Context)
		defer in.stop()
		if _, err := clix.Args(c, 0, 0, "[flags]"); err != nil {
			return err
		}
		req, err := createRequest(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if err := clix.EnsureDefaultImage(c, e, req); err != nil {
			return interruptedOr(in, err)
		}
		if err := clix.EnsurePulled(c, e, &req); err != nil {
			return interruptedOr(in, err)
		}
		sb, err := e.Create(in.ctx, req)
		if err != nil {
			return interruptedOr(in, err)
		}
		warnUnenforced(c, e, sb)
		fmt.Fprintln(c.App.Writer, sb.ID)
		return nil
	},
}

var execFlags = []cli.Flag{
	&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "keep stdin open and feed it to the command"},
	ttyFlag,
}

var runCommand = &cli.Command{
	Name:                   "run",
	Usage:                  "create a sandbox and run a command in it",
	ArgsUsage:              "-- CMD [ARG...]",
	UseShortOptionHandling: true,
	Flags: append(append([]cli.Flag{
		&cli.BoolFlag{Name: "rm", Usage: "remove the sandbox when the command exits"},
		&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "user of the command: uid[:gid] or name[:group]"},
	}, createFlags...), execFlags...),
	Action: func(c *cli.Context) error {
		// A signal before the command runs aborts the run, which then
		// leaves nothing behind; once it runs, the command gets it.
		in := catchSignals(c.Context)
		defer in.stop()
		// A reader of the command's output that goes first does not end
		// this process before it has removed what it must (main ends it
		// by SIGPIPE after).
		clix.DeferBrokenPipe()
		args := c.Args().Slice()
		if len(args) == 0 {
			return clix.UsageError(errors.New("usage: hutch run [flags] -- CMD [ARG...]"))
		}
		req, err := createRequest(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if err := clix.EnsureDefaultImage(c, e, req); err != nil {
			return interruptedOr(in, err)
		}
		if err := clix.EnsurePulled(c, e, &req); err != nil {
			return interruptedOr(in, err)
		}
		// A pooled sandbox if a pool serves req: claimed and run in by
		// this one process, as for a fresh one.
		sb, err := e.Claim(in.ctx, req)
		if err != nil {
			return interruptedOr(in, err)
		}
		var code int
		switch {
		case sb != nil:
			code, err = runIn(c, args, in, func(xreq engine.ExecRequest) (int, error) { return e.Exec(in.ctx, sb.ID, xreq) })
		case c.Bool("rm"):
			// The sandbox lives for this one command: its init can
			// start it at boot.
			code, err = runIn(c, args, in, func(xreq engine.ExecRequest) (int, error) {
				var code int
				var err error
				sb, code, err = e.Run(in.ctx, req, xreq)
				return code, err
			})
			if sb == nil {
				return interruptedOr(in, clix.Exit(code, err))
			}
		default:
			if sb, err = e.Create(in.ctx, req); err != nil {
				return interruptedOr(in, err)
			}
			code, err = runIn(c, args, in, func(xreq engine.ExecRequest) (int, error) { return e.Exec(in.ctx, sb.ID, xreq) })
		}
		// Without --rm, a sandbox whose command never ran is removed
		// too: hutch run has not named it to anyone.
		if c.Bool("rm") || (in.cause() != nil && !in.commandRan()) {
			// Removed already (hutch rm -f under it) is what --rm wants.
			// The caller waits for the command's status, not for the
			// teardown, which a detached hutch finishes.
			if rmErr := e.RemoveLater(context.Background(), sb.ID); rmErr != nil && err == nil && !errdefs.IsNotFound(rmErr) {
				return rmErr
			}
		}
		return interruptedOr(in, clix.Exit(code, err))
	},
}

var execCommand = &cli.Command{
	Name:                   "exec",
	Usage:                  "run a command in a running sandbox",
	ArgsUsage:              "ID -- CMD [ARG...]",
	UseShortOptionHandling: true,
	Flags: append([]cli.Flag{
		&cli.BoolFlag{Name: "detach", Aliases: []string{"d"}, Usage: "start the command and return"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "environment KEY=VALUE"},
		&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory"},
		&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "uid[:gid] or name[:group]"},
		&cli.DurationFlag{Name: "timeout", Usage: "kill the command after this long (exit 124)"},
	}, execFlags...),
	Action: func(c *cli.Context) error {
		id, args, err := clix.CommandAfterID(c, "ID -- CMD [ARG...]")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		in := catchSignals(c.Context)
		defer in.stop()
		code, err := runIn(c, args, in, func(req engine.ExecRequest) (int, error) { return e.Exec(in.ctx, id, req) })
		return interruptedOr(in, clix.Exit(code, err))
	},
}

// interruptedOr is err, or the interrupt's status if a signal ended the
// command's work.
func interruptedOr(in *interrupt, err error) error {
	if err != nil && in.cause() != nil {
		return in.exit()
	}
	return err
}

func notifySignals() chan os.Signal {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	return sigs
}

// runIn runs args through exec with the exec flags of c. It returns the
// command's exit status, or 125 with an error of hutch's own.
func runIn(c *cli.Context, args []string, in *interrupt, exec func(engine.ExecRequest) (int, error)) (int, error) {
	req := engine.ExecRequest{
		Args: args, Workdir: c.String("workdir"), User: c.String("user"),
		Stdout: c.App.Writer, Stderr: c.App.ErrWriter, Timeout: c.Duration("timeout"),
		Detach: c.Bool("detach"),
	}
	ended := in.forward(&req)
	if c.Command.Name == "exec" {
		req.Env = c.StringSlice("env")
	} else {
		// run: the create flags' --workdir and --env already apply, and
		// --timeout is the sandbox's lifetime.
		req.Workdir, req.Timeout = "", 0
	}
	if c.Bool("interactive") {
		req.Stdin = c.App.Reader
	}
	if c.Bool("tty") {
		restore, err := attachTerminal(&req, c.Bool("interactive"))
		if err != nil {
			return clix.ExitRuntime, err
		}
		defer restore()
	}
	if req.Stdout == nil {
		req.Stdout = os.Stdout
	}
	if req.Stderr == nil {
		req.Stderr = os.Stderr
	}
	code, err := exec(req)
	ended()
	switch {
	case errors.Is(err, engine.ErrTimeout):
		return code, err
	case err != nil && code < 0:
		return clix.ExitRuntime, err
	}
	return code, err
}

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list sandboxes",
	Flags:   []cli.Flag{clix.FormatFlag, &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print IDs only"}},
	Action: func(c *cli.Context) error {
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		if _, err := clix.Args(c, 0, 0, "[--format json]"); err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		all, err := e.List(c.Context)
		if err != nil {
			return err
		}
		switch {
		case asJSON:
			if all == nil {
				all = []*engine.Sandbox{}
			}
			return clix.WriteJSON(c.App.Writer, all)
		case c.Bool("quiet"):
			for _, sb := range all {
				fmt.Fprintln(c.App.Writer, sb.ID)
			}
			return nil
		}
		return writeTable(c.App.Writer, all)
	},
}

func writeTable(w io.Writer, all []*engine.Sandbox) error {
	return clix.WriteTable(w, 3, []string{"ID", "NAME", "IMAGE", "STATE", "CREATED"}, all, func(sb *engine.Sandbox) []string {
		return []string{sb.ShortID(), sb.Name, sb.Image, sb.State, time.Since(sb.Created).Round(time.Second).String() + " ago"}
	})
}

var inspectCommand = &cli.Command{
	Name:      "inspect",
	Usage:     "show a sandbox as JSON",
	ArgsUsage: "ID",
	Flags: []cli.Flag{&cli.StringFlag{Name: "format", Value: "json",
		Usage: "output format: json, or debug for the engine's full record (host PIDs and paths; its fields may change)"}},
	Action: func(c *cli.Context) error {
		f := c.String("format")
		if f != "json" && f != "debug" {
			return clix.UsageError(fmt.Errorf("--format %q: inspect prints json or debug", f))
		}
		a, err := clix.Args(c, 1, 1, "ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if f == "debug" {
			rec, err := e.Record(c.Context, a[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "%s\n", rec)
			return err
		}
		sb, err := e.Get(c.Context, a[0])
		if err != nil {
			return err
		}
		return clix.WriteJSON(c.App.Writer, sb)
	},
}

var stopCommand = &cli.Command{
	Name:      "stop",
	Usage:     "stop sandboxes (their records stay until rm)",
	ArgsUsage: "ID...",
	Action: forEachID(func(c *cli.Context, e *engine.Engine, id string) error {
		_, err := e.Stop(c.Context, id)
		return err
	}),
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "remove sandboxes",
	ArgsUsage: "ID...",
	Flags:     []cli.Flag{&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "stop running sandboxes first"}},
	Action: forEachID(func(c *cli.Context, e *engine.Engine, id string) error {
		return e.Remove(c.Context, id, c.Bool("force"))
	}),
}

// forEachID is the action of a command that takes IDs (stop, rm, pause,
// resume): it opens the engine and applies fn to every ID (see eachID).
func forEachID(fn func(c *cli.Context, e *engine.Engine, id string) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		a, err := clix.Args(c, 1, -1, "ID...")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		return eachID(c, a, func(id string) error { return fn(c, e, id) })
	}
}

// eachID applies fn to every ID, printing each one done; it reports every
// failure and fails if any did.
func eachID(c *cli.Context, ids []string, fn func(string) error) error {
	var failed error
	for _, id := range ids {
		if err := fn(id); err != nil {
			if failed != nil {
				fmt.Fprintf(c.App.ErrWriter, "hutch: %v\n", failed)
			}
			failed = err
			continue
		}
		fmt.Fprintln(c.App.Writer, id)
	}
	return failed
}
