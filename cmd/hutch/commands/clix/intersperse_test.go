package clix

import (
	"reflect"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestIntersperse(t *testing.T) {
	app := &cli.App{
		Flags: []cli.Flag{&cli.StringFlag{Name: "root"}},
		Commands: []*cli.Command{
			{Name: "update", Flags: []cli.Flag{&cli.StringFlag{Name: "net"}, &cli.StringSliceFlag{Name: "allow"}, &cli.BoolFlag{Name: "clear-allow"}}},
			{Name: "exec", ArgsUsage: "ID -- CMD [ARG...]", Flags: []cli.Flag{&cli.BoolFlag{Name: "i", Aliases: []string{"interactive"}}, &cli.BoolFlag{Name: "t"}, &cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}}}},
			{Name: "image", Subcommands: []*cli.Command{{Name: "rm", Flags: []cli.Flag{&cli.BoolFlag{Name: "force"}}}}},
		},
	}
	for _, tc := range []struct{ in, want []string }{
		{[]string{"hutch", "update", "ID", "--net", "open", "--allow", "a.com"}, []string{"hutch", "update", "--net", "open", "--allow", "a.com", "ID"}},
		{[]string{"hutch", "--root", "/r", "update", "ID", "--clear-allow"}, []string{"hutch", "--root", "/r", "update", "--clear-allow", "ID"}},
		{[]string{"hutch", "update", "--net=open", "ID"}, []string{"hutch", "update", "--net=open", "ID"}},
		{[]string{"hutch", "exec", "-it", "ID", "--", "ls", "--net", "x"}, []string{"hutch", "exec", "-it", "ID", "--", "ls", "--net", "x"}},
		{[]string{"hutch", "exec", "ID", "ls", "-la"}, []string{"hutch", "exec", "ID", "ls", "-la"}},
		{[]string{"hutch", "exec", "-e", "A=1", "ID", "env"}, []string{"hutch", "exec", "-e", "A=1", "ID", "env"}},
		{[]string{"hutch", "image", "rm", "x", "--force"}, []string{"hutch", "image", "rm", "--force", "x"}},
		{[]string{"hutch", "nosuch", "x", "--y"}, []string{"hutch", "nosuch", "x", "--y"}},
		{[]string{"hutch"}, []string{"hutch"}},
	} {
		if got := Intersperse(app, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Intersperse(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
