package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"syscall"
)

// First-command mode (`sbx-init first`): the init of a sandbox made for
// one command (`sbx run --rm`) starts that command itself as soon as the
// sandbox boots, instead of waiting for an exec. Its stdio are the
// sandbox's log, as always; the command's come from the host with two more
// descriptors (runsc run --pass-fd):
//
//	FirstRequestFD: the command, a FirstRequest as JSON, read to EOF
//	FirstStatusFD:  where the init writes the command's status, one line
//	FirstStdioFD:   the command's stdin, then stdout and stderr
//
// While the command runs, the init passes SIGINT, SIGTERM, SIGHUP and
// SIGQUIT on to it; when it exits, the init writes its status and exits,
// which stops the sandbox.
const (
	CmdFirst       = "first"
	FirstRequestFD = 3
	FirstStatusFD  = 4
	FirstStdioFD   = 5
)

// FirstRequest is the first command: what an exec would get.
type FirstRequest struct {
	Args   []string `json:"args"`
	Env    []string `json:"env"`
	Dir    string   `json:"dir"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// first is the first command's process.
var first struct {
	pid    int
	status *os.File
}

// startFirst reads the request and starts the command. A non-zero return
// is the init's exit status: the command could not be read or started
// (its 126/127 status is written first).
func startFirst() int {
	// None of the host's descriptors may leak into the command beyond its
	// stdio.
	for fd := FirstRequestFD; fd < FirstStdioFD+3; fd++ {
		syscall.CloseOnExec(fd)
	}
	first.status = os.NewFile(FirstStatusFD, "status")
	req := os.NewFile(FirstRequestFD, "request")
	var r FirstRequest
	err := json.NewDecoder(io.LimitReader(req, 16<<20)).Decode(&r)
	req.Close()
	if err != nil || len(r.Args) == 0 {
		logLine("init", fmt.Sprintf("bad first command: %v", err))
		writeFirstStatus("error bad request")
		return 1
	}
	path, status, err := resolve(r.Args[0], r.Env, r.Dir)
	if err == nil {
		groups := make([]uint32, len(r.Groups))
		copy(groups, r.Groups)
		first.pid, err = syscall.ForkExec(path, r.Args, &syscall.ProcAttr{
			Dir:   r.Dir,
			Env:   r.Env,
			Files: []uintptr{FirstStdioFD, FirstStdioFD + 1, FirstStdioFD + 2},
			Sys: &syscall.SysProcAttr{
				Credential: &syscall.Credential{Uid: r.UID, Gid: r.GID, Groups: groups},
			},
		})
		if err != nil {
			status = StatusNotExecutable
			if err == syscall.ENOENT {
				status = StatusNotFound
			}
		}
	}
	if err != nil {
		logLine("init", fmt.Sprintf("first command %s: %v", r.Args[0], err))
		writeFirstStatus(fmt.Sprintf("exit %d", status))
		return status
	}
	// Only the command holds its stdio now: its output ends with it.
	for fd := FirstStdioFD; fd < FirstStdioFD+3; fd++ {
		syscall.Close(fd)
	}
	logLine("init", fmt.Sprintf("started %d: first command", first.pid))
	return 0
}

// firstExited reports the first command's status to the host.
func firstExited(ws syscall.WaitStatus) {
	if ws.Signaled() {
		logLine("init", fmt.Sprintf("%d exited: killed by signal %d", first.pid, ws.Signal()))
		writeFirstStatus(fmt.Sprintf("signal %d", ws.Signal()))
		return
	}
	logLine("init", fmt.Sprintf("%d exited with status %d", first.pid, ws.ExitStatus()))
	writeFirstStatus(fmt.Sprintf("exit %d", ws.ExitStatus()))
}

func writeFirstStatus(s string) {
	fmt.Fprintln(first.status, s)
	first.status.Close()
}
