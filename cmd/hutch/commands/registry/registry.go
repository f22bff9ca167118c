// Package registry holds `hutch login` and `hutch logout`: credentials for OCI
// registries, kept under the state root.
package registry

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// Commands are login and logout, top-level verbs of hutch.
var Commands = []*cli.Command{loginCommand, logoutCommand}

var loginCommand = &cli.Command{
	Name:      "login",
	Usage:     "check and store credentials for a registry (in the state root, mode 0600)",
	ArgsUsage: "REGISTRY",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "username", Aliases: []string{"u"}, Usage: "user name"},
		&cli.BoolFlag{Name: "password-stdin", Usage: "read the password (or token) from stdin"},
		clix.InsecureRegistryFlag, clix.CACertFlag,
	},
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "REGISTRY")
		if err != nil {
			return err
		}
		user := c.String("username")
		if user == "" {
			return clix.UsageError(errors.New("login: --username is required"))
		}
		password, err := readPassword(c)
		if err != nil {
			return err
		}
		reg, err := clix.RegistryOptions(c)
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if err := e.Login(c.Context, engine.LoginRequest{
			Registry: a[0], Username: user, Password: password, Options: reg,
		}); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "logged in to %s\n", a[0])
		return nil
	},
}

// readPassword reads the password from stdin (--password-stdin), or asks
// for it on the terminal.
func readPassword(c *cli.Context) (string, error) {
	if c.Bool("password-stdin") {
		b, err := io.ReadAll(io.LimitReader(c.App.Reader, 1<<16))
		if err != nil {
			return "", fmt.Errorf("read password from stdin: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	f, ok := c.App.Reader.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return "", clix.UsageError(errors.New("login: stdin is not a terminal: pass the password with --password-stdin"))
	}
	var w io.Writer = os.Stderr
	if c.App.ErrWriter != nil {
		w = c.App.ErrWriter
	}
	fmt.Fprint(w, "Password: ")
	b, err := term.ReadPassword(int(f.Fd()))
	fmt.Fprintln(w)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

var logoutCommand = &cli.Command{
	Name:      "logout",
	Usage:     "forget the stored credentials for a registry",
	ArgsUsage: "REGISTRY",
	Action: func(c *cli.Context) error {
		a, err := clix.Args(c, 1, 1, "REGISTRY")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		if err := e.Logout(a[0]); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "logged out of %s\n", a[0])
		return nil
	},
}
