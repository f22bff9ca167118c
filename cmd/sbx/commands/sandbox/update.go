package sandbox

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"sbx.dev/sbx/cmd/sbx/commands/clix"
	"sbx.dev/sbx/engine"
)

var updateCommand = &cli.Command{
	Name:      "update",
	Usage:     "change a running sandbox's network policy",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "net", Usage: "network mode: none, open or allow"},
		&cli.StringSliceFlag{Name: "allow", Usage: "replace the allow rules (CIDR[:PORT], DOMAIN[:PORT], *.DOMAIN[:PORT])"},
		&cli.BoolFlag{Name: "clear-allow", Usage: "remove every allow rule"},
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
		if req.Network == nil && req.Allow == nil {
			return clix.UsageError(fmt.Errorf("update: nothing to change (give --net, --allow or --clear-allow)"))
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
