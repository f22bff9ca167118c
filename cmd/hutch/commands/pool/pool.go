// Package pool is the `hutch pool` noun: warm pools of booted, unused
// sandboxes that creates of a matching class take instead of booting
// their own (engine.CreatePool).
package pool

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Commands are `hutch pool` and the hidden filler the engine starts.
var Commands = []*cli.Command{Command, fillCommand}

// Command is `hutch pool`.
var Command = &cli.Command{
	Name:        "pool",
	Usage:       "manage warm pools of booted sandboxes",
	Subcommands: []*cli.Command{createCommand, lsCommand, rmCommand},
}

var createCommand = &cli.Command{
	Name:      "create",
	Usage:     "keep N sandboxes of a class booted for creates that match it",
	ArgsUsage: "NAME",
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "size", Usage: "how many sandboxes to keep ready", Required: true},
		&cli.BoolFlag{Name: "wait", Usage: "return once the pool is full"},
		&cli.StringFlag{Name: "image", Usage: "image of the pool's sandboxes (default " + engine.DefaultImage + ")"},
		&cli.StringFlag{Name: "cpus", Usage: "CPU limit, in cores (default 2)"},
		&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 512m, 2g (default 2g)"},
		&cli.StringFlag{Name: "pids", Usage: "process limit (default 1024)"},
		&cli.StringFlag{Name: "disk", Usage: "writable layer size, e.g. 1g (default 10g)"},
		&cli.StringFlag{Name: "net", Value: "none", Usage: "network mode: none, open or allow; a pool with a network serves creates of open and allow"},
		&cli.StringSliceFlag{Name: "allow", Usage: "allow egress to CIDR[:PORT], IP[:PORT], DOMAIN[:PORT] or *.DOMAIN[:PORT]"},
		&cli.StringSliceFlag{Name: "dns", Usage: "upstream DNS server for the sandboxes' resolver (default: the host's)"},
		clix.DockerFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "NAME --size N [create flags]")
		if err != nil {
			return err
		}
		req, err := classRequest(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if err := clix.EnsureDefaultImage(c, e, req); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if _, err := e.CreatePool(ctx, engine.PoolRequest{Name: a[0], Size: c.Int("size"), Create: req}); err != nil {
			return err
		}
		if c.Bool("wait") {
			// The filler CreatePool started may still hold the pool:
			// fill here too, then wait for it.
			if err := e.FillPool(ctx, a[0]); err != nil {
				return err
			}
			return waitFull(ctx, e, a[0])
		}
		return nil
	},
}

// waitFull waits until pool name has all its sandboxes ready.
func waitFull(ctx context.Context, e *engine.Engine, name string) error {
	for {
		pools, err := e.Pools(ctx)
		if err != nil {
			return err
		}
		for _, p := range pools {
			if p.Name != name {
				continue
			}
			if p.Ready >= p.Size {
				return nil
			}
			if p.Error != "" {
				return fmt.Errorf("pool %s: %s", name, p.Error)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timeAfter():
		}
	}
}

// classRequest renders the class flags of pool create.
func classRequest(c *cli.Context) (engine.CreateRequest, error) {
	req := engine.CreateRequest{
		Image: c.String("image"), Network: c.String("net"),
		Allow: c.StringSlice("allow"), DNS: c.StringSlice("dns"), Docker: c.Bool("docker"),
	}
	return req, clix.Limits(c, &req)
}

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list pools: their size and how many sandboxes are ready",
	Flags:   []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		if _, err := clix.Args(c, 0, 0, ""); err != nil {
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
		pools, err := e.Pools(c.Context)
		if err != nil {
			return err
		}
		if asJSON {
			return clix.WriteJSON(c.App.Writer, pools)
		}
		return clix.WriteTable(c.App.Writer, 2, []string{"NAME", "IMAGE", "READY", "SIZE", "CPUS", "MEMORY", "NETWORK", "ERROR"}, pools, func(p *engine.Pool) []string {
			return []string{p.Name, p.Image, strconv.Itoa(p.Ready), strconv.Itoa(p.Size),
				fmt.Sprintf("%g", p.CPUs), fmt.Sprintf("%dMiB", p.Memory>>20), p.Network, strings.TrimSpace(p.Error)}
		})
	},
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Usage:     "remove pools and their sandboxes",
	ArgsUsage: "NAME...",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, -1, "NAME...")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		for _, name := range a {
			if err := e.RemovePool(c.Context, name); err != nil {
				return err
			}
		}
		return nil
	},
}

// fillCommand is started by the engine, detached, to refill a pool.
var fillCommand = &cli.Command{
	Name:      engine.PoolFillCommand,
	Hidden:    true,
	ArgsUsage: "NAME",
	Flags: []cli.Flag{
		&cli.DurationFlag{Name: "delay", Usage: "wait this long first"},
		&cli.IntFlag{Name: "lock-fd", Value: -1, Usage: "a descriptor of the pool's fillers.lock, held shared, inherited"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "NAME")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
		if fd := c.Int("lock-fd"); fd >= 0 {
			return e.FillPoolAfterLocked(context.Background(), a[0], c.Duration("delay"), os.NewFile(uintptr(fd), "fillers.lock"))
		}
		return e.FillPoolAfter(context.Background(), a[0], c.Duration("delay"))
	},
}

func timeAfter() <-chan time.Time { return time.After(50 * time.Millisecond) }
