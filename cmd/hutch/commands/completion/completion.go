package completion

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
)

// Command is `hutch completion bash|zsh|fish`.
var Command = &cli.Command{
	Name:      "completion",
	Usage:     "print the shell completion of hutch for bash, zsh or fish",
	ArgsUsage: "bash|zsh|fish",
	Description: `The package installs them where each shell looks. By hand:

  bash: hutch completion bash > /etc/bash_completion.d/hutch
  zsh:  hutch completion zsh > "${fpath[1]}/_hutch"
  fish: hutch completion fish > ~/.config/fish/completions/hutch.fish`,
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "bash|zsh|fish")
		if err != nil {
			return err
		}
		t := Tree(c.App)
		switch a[0] {
		case "bash":
			Bash(c.App.Writer, t)
		case "zsh":
			Zsh(c.App.Writer, t)
		case "fish":
			Fish(c.App.Writer, t)
		default:
			return clix.UsageError(fmt.Errorf("completion %q: want bash, zsh or fish", a[0]))
		}
		return nil
	},
}

// ManCommand is `hutch man`: the manual page, hutch(1), in roff.
var ManCommand = &cli.Command{
	Name:   "man",
	Usage:  "print the manual page of hutch (roff)",
	Hidden: true,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "date", Usage: "the date the page carries (default today), e.g. the build's"},
	},
	Action: func(c *cli.Context) error {
		if _, err := clix.Args(c, 0, 0, ""); err != nil {
			return err
		}
		date := c.String("date")
		if date == "" {
			date = time.Now().UTC().Format("2006-01-02")
		}
		Man(c.App.Writer, Tree(c.App), "1", date, c.App.Version)
		return nil
	},
}
