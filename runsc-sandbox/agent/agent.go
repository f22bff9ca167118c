// Package agent is sbx's init inside a sandbox: PID 1 of every sandbox, a
// small static program bind-mounted read-only at MountPath.
//
// As init it reaps orphans and exits on SIGTERM, which stops the sandbox.
// Its "lookpath" mode tells why a command could not start (127 not found,
// 126 not executable), resolved inside the sandbox's own filesystem. Its
// "spawn" mode asks the running init to start a background process as its
// own child (see spawn.go), so that the process survives checkpoint and
// restore; the init logs such processes' output with timestamps. Its
// "supervise" mode (supervise*.go) is a session through which the host
// starts and follows commands that run as children of the init: they
// survive checkpoint and restore too, and a later session attaches to them
// again.
//
// It runs inside gVisor: it must not depend on anything of the host.
package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// MountPath is where the agent binary appears inside a sandbox.
const MountPath = "/.sbx/sbx-init"

// Exit statuses of lookpath, the shell's conventions.
const (
	StatusFound         = 0
	StatusNotExecutable = 126
	StatusNotFound      = 127
)

// subcommands are the agent's modes besides init and lookpath, by name;
// each file that adds one registers it in an init function.
var subcommands = map[string]func(args []string) int{}

// Main runs the agent with os.Args and exits.
func Main() {
	if len(os.Args) > 1 && subcommands[os.Args[1]] != nil {
		os.Exit(subcommands[os.Args[1]](os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "lookpath" {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: sbx-init lookpath NAME")
			os.Exit(2)
		}
		os.Exit(LookPath(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == CmdWriteSecrets {
		os.Exit(writeSecrets(os.Stdin))
	}
	if len(os.Args) > 1 && os.Args[1] == CmdWithSecrets {
		os.Exit(withSecrets(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "spawn" {
		os.Exit(spawnClient(os.Args[2:]))
	}
	os.Exit(initLoop())
}

// LookPath classifies name as the shell would before running it: found and
// executable, not executable (126), or not found (127). The working
// directory and PATH are the caller's.
func LookPath(name string) int {
	path := name
	if !strings.Contains(name, "/") {
		_, err := exec.LookPath(name)
		switch {
		case err == nil:
			return StatusFound
		case errors.Is(err, fs.ErrPermission):
			return StatusNotExecutable
		default:
			// exec.LookPath skips files without x bits; a file that
			// exists on PATH but is not executable is still a 126.
			for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
				if dir == "" {
					dir = "."
				}
				if fi, err := os.Stat(dir + "/" + name); err == nil && !fi.IsDir() {
					return StatusNotExecutable
				}
			}
			return StatusNotFound
		}
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return StatusNotFound
	case err != nil:
		return StatusNotExecutable
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		return StatusNotExecutable
	}
	return StatusFound
}

// initLoop is PID 1: it reaps every child that is reparented to it and
// returns when asked to stop.
func initLoop() int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	serve()
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			return 0
		}
	}
	return 0
}

func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		childExited(pid, ws)
	}
}
