package sandbox

import (
	"fmt"

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
		header := []string{"ID", "CPU %", "CPU LIMIT", "MEM USAGE / LIMIT", "OOM KILLS", "PIDS / LIMIT", "DISK USED / LIMIT"}
		return clix.WriteTable(c.App.Writer, 3, header, []*engine.Stats{st}, func(st *engine.Stats) []string {
			return []string{st.ID[:12], fmt.Sprintf("%.1f%%", st.CPU.Percent), fmt.Sprintf("%g", st.CPU.Limit),
				engine.FormatSize(int64(st.Memory.Usage)) + " / " + engine.FormatSize(int64(st.Memory.Limit)), fmt.Sprintf("%d", st.Memory.OOMKills),
				fmt.Sprintf("%d / %d", st.Pids.Current, st.Pids.Limit),
				engine.FormatSize(int64(st.Disk.Used)) + " / " + engine.FormatSize(st.Disk.Limit)}
		})
	},
}
