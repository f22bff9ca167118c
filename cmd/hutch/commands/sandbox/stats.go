package sandbox

import (
	"fmt"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"hutch.dev/hutch/cmd/hutch/commands/clix"
	"hutch.dev/hutch/engine"
)

var statsCommand = &cli.Command{
	Name:      "stats",
	Usage:     "show a running sandbox's CPU, memory, process and disk use",
	ArgsUsage: "ID",
	Flags:     []cli.Flag{clix.FormatFlag},
	Action: func(c *cli.Context) error {
		asJSON, err := clix.CheckFormat(c)
		if err != nil {
			return err
		}
		a, err := clix.Args(c, 1, 1, "[--format json] ID")
		if err != nil {
			return err
		}
		e, err := clix.Engine(c)
		if err != nil {
			return err
		}
		st, err := e.Stats(c.Context, a[0])
		if err != nil {
			return err
		}
		if asJSON {
			return clix.WriteJSON(c.App.Writer, st)
		}
		tw := tabwriter.NewWriter(c.App.Writer, 0, 8, 3, ' ', 0)
		fmt.Fprintln(tw, "ID\tCPU %\tCPU LIMIT\tMEM USAGE / LIMIT\tOOM KILLS\tPIDS / LIMIT\tDISK USED / LIMIT")
		fmt.Fprintf(tw, "%s\t%.1f%%\t%g\t%s / %s\t%d\t%d / %d\t%s / %s\n",
			st.ID[:12], st.CPU.Percent, st.CPU.Limit,
			engine.FormatSize(int64(st.Memory.Usage)), engine.FormatSize(int64(st.Memory.Limit)), st.Memory.OOMKills,
			st.Pids.Current, st.Pids.Limit,
			engine.FormatSize(int64(st.Disk.Used)), engine.FormatSize(st.Disk.Limit))
		return tw.Flush()
	},
}
