package engine

import (
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// WinSize is a terminal's size in character cells.
type WinSize = runsc.WinSize

// ShellCommand is the command of an interactive shell in a sandbox: the
// image's /bin/bash if it has one, else /bin/sh, as a login shell. Run it
// with ExecRequest.TTY.
var ShellCommand = []string{agent.MountPath, "shell"}

// ttyProcess makes proc run on a terminal, TERM=xterm unless set.
func ttyProcess(proc *specs.Process) {
	proc.Terminal = true
	for _, kv := range proc.Env {
		if strings.HasPrefix(kv, "TERM=") {
			return
		}
	}
	proc.Env = append(proc.Env, "TERM=xterm")
}
