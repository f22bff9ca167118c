package sandbox

import (
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var ttyFlag = &cli.BoolFlag{Name: "tty", Aliases: []string{"t"}, Usage: "run the command on a terminal (with -i: an interactive one)"}

var shellCommand = &cli.Command{
	Name:      "shell",
	Usage:     "open an interactive login shell in a running sandbox",
	ArgsUsage: "ID",
	Flags: []cli.Flag{
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "environment KEY=VALUE"},
		&cli.StringFlag{Name: "workdir", Aliases: []string{"w"}, Usage: "working directory"},
		&cli.StringFlag{Name: "user", Aliases: []string{"u"}, Usage: "uid[:gid] or name[:group]"},
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "[flags] ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		req := engine.ExecRequest{
			Args: engine.ShellCommand, Env: c.StringSlice("env"), Workdir: c.String("workdir"),
			User: c.String("user"), TTY: true,
		}
		restore, err := attachTerminal(&req, true)
		if err != nil {
			return err
		}
		defer restore()
		sigs := notifySignals()
		defer signal.Stop(sigs)
		req.Signals = sigs
		code, err := e.Exec(c.Context, a[0], req)
		if err != nil && code < 0 {
			code = clix.ExitRuntime
		}
		restore()
		return clix.Exit(code, err)
	},
}

// attachTerminal sets req up to run on a pty tied to the caller's
// terminal: with interactive, stdin must be a terminal and is put in raw
// mode (so ^C reaches the sandboxed command as a byte); the size is sent at
// start and again on every SIGWINCH. restore undoes it all; it must run on
// every path out, and may run more than once.
func attachTerminal(req *engine.ExecRequest, interactive bool) (restore func(), err error) {
	in := int(os.Stdin.Fd())
	sizeFd := in
	if !term.IsTerminal(in) {
		if interactive {
			return nil, clix.UsageError(errors.New("-t with -i needs a terminal on stdin: drop -t, or run hutch in a terminal"))
		}
		sizeFd = int(os.Stdout.Fd())
	}
	req.TTY = true
	req.Stdout = os.Stdout
	if w, h, err := term.GetSize(sizeFd); err == nil {
		req.Size = engine.WinSize{Rows: uint16(h), Cols: uint16(w)}
	}
	var state *term.State
	if interactive {
		req.Stdin = os.Stdin
		if state, err = term.MakeRaw(in); err != nil {
			return nil, clix.UsageError(err)
		}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	resize := make(chan engine.WinSize, 1)
	req.Resize = resize
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				w, h, err := term.GetSize(sizeFd)
				if err != nil {
					continue
				}
				select {
				case resize <- engine.WinSize{Rows: uint16(h), Cols: uint16(w)}:
				case <-stop:
					return
				}
			case <-stop:
				return
			}
		}
	}()
	done := false
	return func() {
		if done {
			return
		}
		done = true
		signal.Stop(winch)
		close(stop)
		if state != nil {
			term.Restore(in, state) //nolint:errcheck // best effort: the terminal may be gone
		}
	}, nil
}
