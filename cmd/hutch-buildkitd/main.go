// Command hutch-buildkitd runs buildkitd for hutch and stops it when it has
// been idle; hutch starts it on demand (buildimg.Daemon.Acquire). Run by an
// unprivileged user, it runs buildkitd in a user namespace of that user's
// (buildimg.UsernsInit is this binary's other role).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"hutch.dev/hutch/buildimg"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == buildimg.UsernsInitArg {
		os.Exit(buildimg.UsernsInit(os.Args[2:]))
	}
	var d buildimg.Daemon
	flag.StringVar(&d.Dir, "dir", "", "state directory")
	flag.StringVar(&d.Buildkitd, "buildkitd", "", "buildkitd binary")
	flag.StringVar(&d.Runtime, "runtime", "", "hutch-buildkit-runtime binary")
	flag.StringVar(&d.Runsc, "runsc", "", "runsc binary")
	flag.StringVar(&d.Platform, "platform", "", "gVisor platform")
	flag.DurationVar(&d.Idle, "idle", buildimg.DefaultIdle, "stop after this long without a build")
	flag.Func("allow", "a rule of the build allow list: steps get a network that reaches what the rules name (repeatable)", func(v string) error {
		d.Allow = append(d.Allow, v)
		return nil
	})
	flag.Func("dns", "an upstream DNS server of the steps' resolvers (repeatable; default the host's)", func(v string) error {
		d.DNS = append(d.DNS, v)
		return nil
	})
	flag.StringVar(&d.CABundle, "ca-bundle", "", "CA bundle the steps with network trust")
	flag.Parse()
	if d.Dir == "" || d.Buildkitd == "" || d.Runtime == "" || d.Runsc == "" {
		fmt.Fprintln(os.Stderr, "usage: hutch-buildkitd --dir DIR --buildkitd PATH --runtime PATH --runsc PATH [--idle D] [--allow RULE]... [--dns IP]... [--ca-bundle FILE]")
		os.Exit(2)
	}
	if err := buildimg.Supervise(context.Background(), d); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-buildkitd:", err)
		os.Exit(1)
	}
}
