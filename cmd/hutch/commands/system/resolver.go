package system

import (
	"context"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// resolverCommand runs one sandbox's DNS resolver; the engine starts it,
// detached, when it gives a sandbox a network.
var resolverCommand = &cli.Command{
	Name:   engine.ResolverCommand,
	Hidden: true,
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "CONFIG")
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return engine.RunResolver(ctx, a[0])
	},
}
