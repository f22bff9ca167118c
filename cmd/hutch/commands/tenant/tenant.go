// Package tenant holds `hutch tenant`: the tenants file of `hutch serve`,
// their API keys and quotas. It edits the file only; a running server
// picks the change up on its own.
package tenant

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/tenant"
)

// Command is `hutch tenant`.
var Command = &cli.Command{
	Name:        "tenant",
	Usage:       "manage the tenants of hutch serve: API keys and quotas",
	Subcommands: []*cli.Command{addCommand, setCommand, lsCommand, rmCommand},
}

// tenantsFlag names the file; every subcommand carries it so it may
// follow the arguments.
var tenantsFlag = &cli.StringFlag{Name: "tenants", Usage: "tenants file, as given to hutch serve --tenants", EnvVars: []string{"HUTCH_TENANTS"}}

// args checks the number of positional arguments, as clix.Args, with
// the usage line naming the whole command.
func args(c *cli.Context, min, max int, usage string) ([]string, error) {
	a := c.Args().Slice()
	if len(a) < min || (max >= 0 && len(a) > max) {
		return nil, clix.UsageError(fmt.Errorf("usage: hutch tenant %s %s", c.Command.Name, usage))
	}
	return a, nil
}

func open(c *cli.Context) (*tenant.Store, error) {
	path := c.String("tenants")
	if path == "" {
		return nil, clix.UsageError(errors.New("--tenants FILE is required: the tenants file hutch serve reads"))
	}
	return tenant.Open(path)
}

// quotaFlagsList are the --max-* flags of add and set.
var quotaFlagsList = []cli.Flag{
	&cli.StringFlag{Name: "max-sandboxes", Usage: "sandboxes the tenant may have at once (default unlimited)"},
	&cli.StringFlag{Name: "max-cpus", Usage: "total CPU cores of its sandboxes (default unlimited)"},
	&cli.StringFlag{Name: "max-memory", Usage: "total memory of its sandboxes, e.g. 8g (default unlimited)"},
	&cli.StringFlag{Name: "max-disk", Usage: "total disk of its sandboxes and snapshots, e.g. 100g (default unlimited)"},
	&cli.StringFlag{Name: "max-snapshots", Usage: "snapshots the tenant may keep (default unlimited)"},
}

// quotaUsage is the --max-* part of add's and set's usage lines.
const quotaUsage = "[--max-sandboxes N] [--max-cpus N] [--max-memory SIZE] [--max-disk SIZE] [--max-snapshots N]"

var addCommand = &cli.Command{
	Name:      "add",
	Usage:     "add a tenant; prints its API key, which is shown only this once",
	ArgsUsage: "NAME",
	Flags:     append([]cli.Flag{tenantsFlag}, quotaFlagsList...),
	Action: func(c *cli.Context) error {
		a, err := args(c, 1, 1, "NAME --tenants FILE "+quotaUsage)
		if err != nil {
			return err
		}
		if err := tenant.ValidateName(a[0]); err != nil {
			return clix.UsageError(err)
		}
		var q tenant.Quota
		if err := quotaFlags(c, &q); err != nil {
			return err
		}
		s, err := open(c)
		if err != nil {
			return err
		}
		key, err := s.Add(a[0], q)
		if err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, key)
		fmt.Fprintf(c.App.ErrWriter, "hutch: added tenant %s; its API key (above) is not stored and will not be shown again\n", a[0])
		return nil
	},
}

var setCommand = &cli.Command{
	Name:      "set",
	Usage:     "change a tenant's quotas: the flags given, the others as they were (0 is unlimited)",
	ArgsUsage: "NAME",
	Flags:     append([]cli.Flag{tenantsFlag}, quotaFlagsList...),
	Action: func(c *cli.Context) error {
		a, err := args(c, 1, 1, "NAME --tenants FILE "+quotaUsage)
		if err != nil {
			return err
		}
		given := false
		for _, f := range quotaFlagsList {
			given = given || c.IsSet(f.Names()[0])
		}
		if !given {
			return clix.UsageError(fmt.Errorf("hutch tenant set %s: no quota given: name at least one of %s", a[0], quotaUsage))
		}
		s, err := open(c)
		if err != nil {
			return err
		}
		if _, err := s.SetQuota(a[0], func(q *tenant.Quota) error { return quotaFlags(c, q) }); err != nil {
			return err
		}
		fmt.Fprintln(c.App.Writer, a[0])
		return nil
	},
}

// quotaFlags sets q's limits from the --max-* flags given; an absent flag
// leaves its limit, and 0 is unlimited.
func quotaFlags(c *cli.Context, q *tenant.Quota) error {
	for _, f := range []struct {
		name string
		dst  *int
	}{{"max-sandboxes", &q.MaxSandboxes}, {"max-snapshots", &q.MaxSnapshots}} {
		if s := c.String(f.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return clix.UsageError(fmt.Errorf("--%s %q: want a whole number, 0 for unlimited", f.name, s))
			}
			*f.dst = n
		}
	}
	if s := c.String("max-cpus"); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return clix.UsageError(fmt.Errorf("--max-cpus %q: want a number of cores, 0 for unlimited", s))
		}
		q.MaxCPUs = f
	}
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"max-memory", &q.MaxMemory}, {"max-disk", &q.MaxDisk}} {
		if s := c.String(f.name); s != "" {
			n, err := engine.ParseSize(s)
			if err != nil {
				return clix.UsageError(fmt.Errorf("--%s: %w", f.name, err))
			}
			*f.dst = n
		}
	}
	return nil
}

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list tenants and their quotas",
	Flags:   []cli.Flag{tenantsFlag, clix.FormatFlag},
	Action: func(c *cli.Context) error {
		if _, err := args(c, 0, 0, "--tenants FILE [--format table|json]"); err != nil {
			return err
		}
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		s, err := open(c)
		if err != nil {
			return err
		}
		ts, err := s.List()
		if err != nil {
			return err
		}
		if asJSON {
			return clix.WriteJSON(c.App.Writer, ts)
		}
		return clix.WriteTable(c.App.Writer, 3, []string{"NAME", "SANDBOXES", "CPUS", "MEMORY", "DISK", "SNAPSHOTS", "CREATED"}, ts, func(t tenant.Tenant) []string {
			q := t.Quota
			return []string{t.Name,
				limit(q.MaxSandboxes != 0, strconv.Itoa(q.MaxSandboxes)),
				limit(q.MaxCPUs != 0, strconv.FormatFloat(q.MaxCPUs, 'f', -1, 64)),
				limit(q.MaxMemory != 0, engine.FormatSize(q.MaxMemory)),
				limit(q.MaxDisk != 0, engine.FormatSize(q.MaxDisk)),
				limit(q.MaxSnapshots != 0, strconv.Itoa(q.MaxSnapshots)),
				t.Created.Local().Format("2006-01-02 15:04:05")}
		})
	},
}

// limit is s, or "unlimited" for a limit that is not set.
func limit(set bool, s string) string {
	if !set {
		return "unlimited"
	}
	return s
}

var rmCommand = &cli.Command{
	Name:      "rm",
	Aliases:   []string{"remove"},
	Usage:     "remove tenants; their keys stop working",
	ArgsUsage: "NAME...",
	Flags:     []cli.Flag{tenantsFlag},
	Action: func(c *cli.Context) error {
		names, err := args(c, 1, -1, "NAME... --tenants FILE")
		if err != nil {
			return err
		}
		s, err := open(c)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := s.Remove(n); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, n)
		}
		return nil
	},
}
