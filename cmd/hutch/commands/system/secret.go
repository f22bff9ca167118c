package system

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var secretCommand = &cli.Command{
	Name:  "secret",
	Usage: "the host's secret store: values the egress gateway injects into sandboxes' requests (--inject), never shown",
	Subcommands: []*cli.Command{
		{
			Name:      "add",
			Usage:     "store a secret, its value read from standard input or --from-file (one final newline dropped)",
			ArgsUsage: "NAME",
			Flags:     []cli.Flag{&cli.StringFlag{Name: "from-file", Usage: "read the value from this file"}},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 1, 1, "NAME [--from-file FILE] (value on standard input)")
				if err != nil {
					return err
				}
				r := c.App.Reader
				if f := c.String("from-file"); f != "" {
					fh, err := os.Open(f)
					if err != nil {
						return clix.UsageError(fmt.Errorf("--from-file: %w", err))
					}
					defer fh.Close()
					r = fh
				}
				v, err := io.ReadAll(io.LimitReader(r, engine.MaxSecretSize+2))
				if err != nil {
					return err
				}
				v = bytes.TrimSuffix(bytes.TrimSuffix(v, []byte("\n")), []byte("\r"))
				e, err := clix.Engine(c)
				if err != nil {
					return err
				}
				if err := e.AddSecret(a[0], v); err != nil {
					return err
				}
				fmt.Fprintln(c.App.Writer, a[0])
				return nil
			},
		},
		{
			Name:    "ls",
			Aliases: []string{"list"},
			Usage:   "list the stored secrets: names and sizes, never values",
			Flags:   []cli.Flag{clix.FormatFlag},
			Action: func(c *cli.Context) error {
				asJSON, err := clix.CheckFormat(c)
				if err != nil {
					return err
				}
				e, err := clix.Engine(c)
				if err != nil {
					return err
				}
				ss, err := e.Secrets()
				if err != nil {
					return err
				}
				if asJSON {
					if ss == nil {
						ss = []engine.SecretInfo{}
					}
					return clix.WriteJSON(c.App.Writer, ss)
				}
				return clix.WriteTable(c.App.Writer, 2, []string{"NAME", "SIZE", "MODIFIED"}, ss, func(s engine.SecretInfo) []string {
					return []string{s.Name, fmt.Sprint(s.Size), s.Modified.Format(time.RFC3339)}
				})
			},
		},
		{
			Name:      "rm",
			Aliases:   []string{"remove"},
			Usage:     "delete secrets; gateways refuse requests that need them from then on",
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
				for _, n := range a {
					if err := e.RemoveSecret(n); err != nil {
						return err
					}
					fmt.Fprintln(c.App.Writer, n)
				}
				return nil
			},
		},
	},
}
