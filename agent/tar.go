package agent

import (
	"fmt"
	"os"

	"hutch.dev/hutch/agent/archive"
	"hutch.dev/hutch/agent/wire"
)

func init() {
	subcommands[wire.ModeTarOut] = tarOutMain
	subcommands[wire.ModeTarIn] = tarInMain
}

// tarOutMain is "tar-out SRC": SRC as a tar stream on stdout.
func tarOutMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init tar-out SRC")
		return 2
	}
	if _, err := os.Lstat(args[0]); err != nil {
		return fail(err)
	}
	if err := archive.WriteTar(os.Stdout, args[0], archive.ArchiveName(args[0])); err != nil {
		return fail(err)
	}
	return 0
}

// tarInMain is "tar-in DST": the tar stream on stdin extracted to DST as
// archive.CopyTarget resolves it.
func tarInMain(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init tar-in DST")
		return 2
	}
	dir, rename, err := archive.CopyTarget(args[0])
	if err != nil {
		return fail(err)
	}
	if err := archive.Extract(os.Stdin, dir, archive.ExtractOptions{Rename: rename}); err != nil {
		return fail(err)
	}
	return 0
}
