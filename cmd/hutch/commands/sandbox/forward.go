package sandbox

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var publishFlag = &cli.StringSliceFlag{
	Name: "publish", Aliases: []string{"p"},
	Usage: "publish a sandbox port on the host: [IP:]HOSTPORT:PORT (IP defaults to " + engine.DefaultPortIP + ", which every local user can reach; works with --net none), or unix:PATH:PORT for a socket only its owner can use",
}

func portMappings(specs []string) ([]engine.PortMapping, error) {
	var out []engine.PortMapping
	for _, s := range specs {
		m, err := engine.ParsePortMapping(s)
		if err != nil {
			return nil, clix.UsageError(err)
		}
		out = append(out, m)
	}
	return out, nil
}

var portForwardCommand = &cli.Command{
	Name:      "port-forward",
	Usage:     "forward host ports to a sandbox's ports until interrupted",
	ArgsUsage: "ID [IP:]HOSTPORT:PORT|unix:PATH:PORT...",
	Flags: []cli.Flag{
		// The detached forwarder of create -p: the listeners are
		// inherited as fds 3, 4, ... in the order of the mappings.
		&cli.BoolFlag{Name: "inherited", Hidden: true},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 2, -1, "ID [IP:]HOSTPORT:PORT|unix:PATH:PORT...")
		if err != nil {
			return err
		}
		ms, err := portMappings(a[1:])
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		var ls []engine.PortListener
		if c.Bool("inherited") {
			for i, m := range ms {
				l, err := net.FileListener(os.NewFile(uintptr(3+i), "listener"))
				if err != nil {
					return err
				}
				if ul, ok := l.(*net.UnixListener); ok {
					// Its socket goes when the forwarder ends.
					ul.SetUnlinkOnClose(true)
				}
				ls = append(ls, engine.PortListener{Listener: l, Port: m.Port})
			}
		} else {
			// Fail early on a sandbox that is not there.
			if _, err := e.Get(c.Context, a[0]); err != nil {
				return err
			}
			if ls, err = engine.ListenPorts(ms); err != nil {
				return err
			}
			for _, l := range ls {
				m := l.Mapping()
				host := m.HostAddr()
				if m.Socket != "" {
					host = engine.PortSocketPrefix + m.Socket
				}
				fmt.Fprintf(c.App.Writer, "forwarding %s -> %d\n", host, m.Port)
			}
		}
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		err = e.Forward(ctx, a[0], ls)
		if err != nil && context.Cause(ctx) == nil {
			return err
		}
		return nil
	},
}
