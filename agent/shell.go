package agent

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"hutch.dev/hutch/agent/wire"
)

// Shells are the shells "shell" tries, in order.
var Shells = []string{"/bin/bash", "/bin/sh"}

func init() {
	subcommands[wire.ModeShell] = shellMain
}

// shellMain is "shell": the image's shell, as an interactive login shell.
func shellMain(args []string) int {
	for _, sh := range Shells {
		if fi, err := os.Stat(sh); err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0 {
			return execOrStatus(append([]string{sh, "-l"}, args...))
		}
	}
	fmt.Fprintf(os.Stderr, "hutch: no shell in this image (tried %s)\n", strings.Join(Shells, ", "))
	return wire.StatusNotFound
}

// execOrStatus replaces the agent with argv, or says why it cannot and
// returns the shell's status for that (126, 127).
func execOrStatus(argv []string) int {
	path := argv[0]
	if !strings.Contains(path, "/") {
		if p, err := exec.LookPath(path); err == nil {
			path = p
		}
	}
	err := syscall.Exec(path, argv, os.Environ())
	code := LookPath(argv[0])
	if code == wire.StatusFound {
		code = wire.StatusNotExecutable
	}
	what := "not executable"
	if code == wire.StatusNotFound {
		what = "command not found"
	}
	fmt.Fprintf(os.Stderr, "hutch: %s: %s (%v)\n", argv[0], what, err)
	return code
}
