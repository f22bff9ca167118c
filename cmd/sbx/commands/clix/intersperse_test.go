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
		{[]string{"sbx", "update", "ID", "--net", "open", "--allow", "a.com"}, []string{"sbx", "update", "--net", "open", "--allow", "a.com", "ID"}},
		{[]string{"sbx", "--root", "/r", "update", "ID", "--clear-allow"}, []string{"sbx", "--root", "/r", "update", "--clear-allow", "ID"}},
		{[]string{"sbx", "update", "--net=open", "ID"}, []string{"sbx", "update", "--net=open", "ID"}},
		{[]string{"sbx", "exec", "-it", "ID", "--", "ls", "--net", "x"}, []string{"sbx", "exec", "-it", "ID", "--", "ls", "--net", "x"}},
		{[]string{"sbx", "exec", "ID", "ls", "-la"}, []string{"sbx", "exec", "ID", "ls", "-la"}},
		{[]string{"sbx", "exec", "-e", "A=1", "ID", "env"}, []string{"sbx", "exec", "-e", "A=1", "ID", "env"}},
		{[]string{"sbx", "image", "rm", "x", "--force"}, []string{"sbx", "image", "rm", "--force", "x"}},
		{[]string{"sbx", "nosuch", "x", "--y"}, []string{"sbx", "nosuch", "x", "--y"}},
		{[]string{"sbx"}, []string{"sbx"}},
	} {
		if got := Intersperse(app, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Intersperse(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
