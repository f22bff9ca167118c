package sandbox

import (
	"fmt"
	"strconv"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var updateCommand = &cli.Command{
	Name:      "update",
	Usage:     "change a running sandbox's limits and network policy",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "net", Usage: "network mode: none, open or allow"},
		&cli.StringSliceFlag{Name: "allow", Usage: "replace the allow rules (CIDR[:PORT], DOMAIN[:PORT], *.DOMAIN[:PORT])"},
		&cli.BoolFlag{Name: "clear-allow", Usage: "remove every allow rule"},
		&cli.StringFlag{Name: "cpus", Usage: "CPU limit, in cores"},
		&cli.StringFlag{Name: "memory", Usage: "memory limit, e.g. 1g (below current use, the sandbox is OOM-killed)"},
		&cli.StringFlag{Name: "pids", Usage: "not changeable: the process limit is fixed when the sandbox starts"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "ID [--net MODE] [--allow RULE]...")
		if err != nil {
			return err
		}
		var req engine.UpdateRequest
		if c.IsSet("net") {
			n := c.String("net")
			req.Network = &n
		}
		switch {
		case c.IsSet("allow") && c.Bool("clear-allow"):
			return clix.UsageError(fmt.Errorf("--allow and --clear-allow exclude each other"))
		case c.IsSet("allow"):
			rules := c.StringSlice("allow")
			req.Allow = &rules
		case c.Bool("clear-allow"):
			req.Allow = &[]string{}
		}
		if c.IsSet("pids") {
			return clix.UsageError(fmt.Errorf("--pids: the process limit inside gVisor is fixed when the sandbox starts; create a new sandbox"))
		}
		if s := c.String("cpus"); s != "" {
			n, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return clix.UsageError(fmt.Errorf("--cpus %q: want a number of cores", s))
			}
			req.CPUs = &n
		}
		if s := c.String("memory"); s != "" {
			n, err := engine.ParseSize(s)
			if err != nil {
				return clix.UsageError(fmt.Errorf("--memory: %w", err))
			}
			req.Memory = &n
		}
		if req.Network == nil && req.Allow == nil && req.CPUs == nil && req.Memory == nil {
			return clix.UsageError(fmt.Errorf("update: nothing to change (give --net, --allow, --clear-allow, --cpus or --memory)"))
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		sb, err := e.Update(c.Context, a[0], req)
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, sb.ID)
		return nil
	},
}
