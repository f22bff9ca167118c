package system

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

// hostCADir is where Debian and Ubuntu keep the CA certificates a host's
// administrator added to its trust store (update-ca-certificates reads
// its *.crt files).
const hostCADir = "/usr/local/share/ca-certificates"

var caCommand = &cli.Command{
	Name:  "ca",
	Usage: "CA certificates every new sandbox and every registry access of this state root trust",
	Subcommands: []*cli.Command{
		{
			Name:      "add",
			Usage:     "trust the certificates of a PEM file from now on",
			ArgsUsage: "FILE",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "name", Usage: "name to keep it under (default: the file's name without its extension)"},
			},
			Action: func(c *cli.Context) error {
				a, err := clix.Args(c, 1, 1, "FILE")
				if err != nil {
					return err
				}
				name := c.String("name")
				if name == "" {
					base := filepath.Base(a[0])
					name = strings.TrimSuffix(base, filepath.Ext(base))
				}
				ca, err := engine.ReadCACert(a[0])
				if err != nil {
					return err
				}
				e, err := clix.Engine(c)
				if err != nil {
					return err
				}
				if err := e.AddTrustedCA(name, ca); err != nil {
					return err
				}
				fmt.Fprintln(c.App.Writer, name)
				return nil
			},
		},
		{
			Name:    "ls",
			Aliases: []string{"list"},
			Usage:   "list the trusted certificates",
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
				cas, err := e.TrustedCAs()
				if err != nil {
					return err
				}
				if asJSON {
					if cas == nil {
						cas = []engine.TrustedCA{}
					}
					return clix.WriteJSON(c.App.Writer, cas)
				}
				return clix.WriteTable(c.App.Writer, 2, []string{"NAME", "SUBJECT", "EXPIRES", "SHA256"}, cas, func(ca engine.TrustedCA) []string {
					return []string{ca.Name, ca.Subject, ca.NotAfter.Format("2006-01-02"), ca.Fingerprint[:16]}
				})
			},
		},
		{
			Name:      "rm",
			Usage:     "stop trusting a certificate file (new sandboxes only)",
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
					if err := e.RemoveTrustedCA(n); err != nil {
						return err
					}
				}
				return nil
			},
		},
	},
}

// hostCAs checks whether the CA certificates the host's administrator
// added (hostCADir) are trusted by sandboxes, and when some are not, says
// how to make them so. It reads files only; it never fails the doctor.
func hostCAs(c *cli.Context, e *engine.Engine) (string, []string) {
	var files []string
	filepath.WalkDir(hostCADir, func(p string, d fs.DirEntry, err error) error { //nolint:errcheck // a missing directory has no files
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".crt") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) == 0 {
		return "none added to this host's trust store (" + hostCADir + ")", nil
	}
	missing, err := e.UntrustedCAFiles(files)
	if err != nil {
		return "", []string{err.Error()}
	}
	if len(missing) == 0 {
		return fmt.Sprintf("the %d CA file(s) of %s are trusted by sandboxes", len(files), hostCADir), nil
	}
	hutch := "hutch"
	if c.IsSet("root") {
		hutch += " --root " + e.Root()
	}
	var adds []string
	for _, f := range missing {
		adds = append(adds, hutch+" ca add "+f)
	}
	return "", []string{
		fmt.Sprintf("this host trusts %d CA file(s) that sandboxes and image pulls do not: %s", len(missing), strings.Join(missing, ", ")),
		"(a TLS-inspecting proxy or a private CA: HTTPS from sandboxes will fail its certificate checks)",
		"trust them in every new sandbox of this state root:",
		"  " + strings.Join(adds, " && "),
		"or in one sandbox: " + hutch + " create --ca-cert " + strings.Join(missing, " --ca-cert ") + " ...",
	}
}
