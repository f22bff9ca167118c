// Package commands is the hutch command line: the app, its global flags, and
// the one way every command builds its engine and reports errors.
package commands

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	checkpointcmd "hutch.dev/hutch/cmd/hutch/commands/checkpoint"
	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/cmd/hutch/commands/completion"
	diffcmd "hutch.dev/hutch/cmd/hutch/commands/diff"
	"hutch.dev/hutch/cmd/hutch/commands/image"
	mcpcmd "hutch.dev/hutch/cmd/hutch/commands/mcp"
	"hutch.dev/hutch/cmd/hutch/commands/pool"
	"hutch.dev/hutch/cmd/hutch/commands/registry"
	"hutch.dev/hutch/cmd/hutch/commands/sandbox"
	servecmd "hutch.dev/hutch/cmd/hutch/commands/serve"
	sshcmd "hutch.dev/hutch/cmd/hutch/commands/ssh"
	"hutch.dev/hutch/cmd/hutch/commands/system"
	"hutch.dev/hutch/cmd/hutch/commands/tenant"
	"hutch.dev/hutch/cmd/hutch/commands/volume"
)

// App is the hutch CLI.
func App() *cli.App {
	cli.VersionFlag = &cli.BoolFlag{Name: "version", Usage: "print the versions of hutch and runsc, as the version command does"}
	cli.VersionPrinter = system.PrintVersion
	app := &cli.App{
		Name:                   "hutch",
		Usage:                  "run commands in disposable gVisor sandboxes",
		Version:                system.Version(),
		UseShortOptionHandling: true,
		Flags:                  clix.GlobalFlags,
		Before:                 clix.Before,
		ExitErrHandler:         func(*cli.Context, error) {},
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return clix.UsageError(err)
		},
	}
	app.Commands = append(app.Commands, system.Commands...)
	app.Commands = append(app.Commands, image.Command)
	app.Commands = append(app.Commands, sandbox.Commands...)
	app.Commands = append(app.Commands, registry.Commands...)
	app.Commands = append(app.Commands, tenant.Command)
	app.Commands = append(app.Commands, volume.Command)
	app.Commands = append(app.Commands, pool.Commands...)
	app.Commands = append(app.Commands, diffcmd.Command)
	app.Commands = append(app.Commands, checkpointcmd.Commands...)
	app.Commands = append(app.Commands, servecmd.Command)
	app.Commands = append(app.Commands, mcpcmd.Command)
	app.Commands = append(app.Commands, sshcmd.Commands...)
	app.Commands = append(app.Commands, completion.Command, completion.ManCommand)
	for _, c := range app.Commands {
		setUsageErrors(c)
	}
	return app
}

// setUsageErrors makes bad flags of every subcommand a runtime error
// (exit 125) rather than urfave's default.
func setUsageErrors(c *cli.Command) {
	c.OnUsageError = func(_ *cli.Context, err error, _ bool) error { return clix.UsageError(err) }
	for _, s := range c.Subcommands {
		setUsageErrors(s)
	}
}

// Main runs the CLI and returns the process's exit status.
func Main(args []string) int {
	return run(App(), args, os.Stderr)
}

func run(app *cli.App, args []string, stderr io.Writer) int {
	err := app.Run(clix.Intersperse(app, args))
	if err == nil {
		return 0
	}
	var st *clix.Status
	if errors.As(err, &st) {
		if st.Err != nil {
			fmt.Fprintf(stderr, "hutch: %v\n", st.Err)
		}
		return st.Code
	}
	fmt.Fprintf(stderr, "hutch: %v\n", err)
	return clix.ExitRuntime
}
