package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"

	"hutch.dev/hutch/agent/ptywire"
	"hutch.dev/hutch/agent/wire"
)

// The agent's "pty" mode runs a command on a terminal of the sandbox's
// own devpts, for a caller outside: `hutch-init pty [--size ROWSxCOLS] --
// CMD...`, started by the host as a plain exec with the command's user,
// environment and directory. It opens /dev/ptmx, starts CMD on the pty's
// replica as the leader of a new session with the replica as its
// controlling terminal, copies the pty's output to its stdout and takes
// ptywire frames on its stdin: input, window sizes, and signals for the
// command's process group. It exits with CMD's status (128+N for signal
// N), 126 or 127 when CMD cannot be executed. The end of its stdin (the
// host went away) hangs the terminal up, as closing a terminal does.

func init() { subcommands[wire.ModePty] = ptyMain }

// ptyOutputLinger bounds how long the output of an ended command is
// still read while a background child of it keeps the terminal open.
const ptyOutputLinger = time.Second

func ptyMain(args []string) int {
	var rows, cols uint16
	for len(args) > 0 && args[0] != "--" {
		if args[0] != "--size" || len(args) < 2 {
			return usage(wire.CmdPty + " [--size ROWSxCOLS] -- CMD [ARG...]")
		}
		r, c, ok := strings.Cut(args[1], "x")
		rn, err1 := strconv.ParseUint(r, 10, 16)
		cn, err2 := strconv.ParseUint(c, 10, 16)
		if !ok || err1 != nil || err2 != nil {
			return usage(wire.CmdPty + " [--size ROWSxCOLS] -- CMD [ARG...]")
		}
		rows, cols = uint16(rn), uint16(cn)
		args = args[2:]
	}
	if len(args) < 2 {
		return usage(wire.CmdPty + " [--size ROWSxCOLS] -- CMD [ARG...]")
	}
	argv := args[1:]
	dir, err := os.Getwd()
	if err != nil {
		dir = "/"
	}
	path, st, err := resolve(argv[0], os.Environ(), dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch: %v\n", err)
		return st
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch: allocate a terminal: %v\n", err)
		return 1
	}
	defer ptmx.Close()
	if rows > 0 && cols > 0 {
		pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols}) //nolint:errcheck // the default size then
	}
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: os.Environ(), Dir: dir,
		Stdin: tty, Stdout: tty, Stderr: tty,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true, Setctty: true, Ctty: 0,
			// Killed with the agent: a host that kills the agent (a
			// timeout) kills the command, as it would a plain exec.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	err = cmd.Start()
	tty.Close() // the command has it: the output ends with its last holder
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch: %s: %v\n", argv[0], err)
		if errors.Is(err, syscall.ENOENT) {
			return wire.StatusNotFound
		}
		return wire.StatusNotExecutable
	}
	pgid := cmd.Process.Pid // the session's leader leads its process group

	out := make(chan struct{})
	go func() {
		defer close(out)
		io.Copy(os.Stdout, ptmx) //nolint:errcheck // EIO once every holder of the replica has closed it
	}()
	go ptyInput(ptmx, pgid)

	cmd.Wait() //nolint:errcheck // the status is read below
	select {
	case <-out:
	case <-time.After(ptyOutputLinger):
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// ptyInput applies the host's frames until its stdin ends, then hangs the
// terminal up: the host is gone.
func ptyInput(ptmx *os.File, pgid int) {
	// Typed input is written apart, so that a program that does not read
	// its terminal holds up neither resizes nor signals.
	typed := make(chan []byte, 64)
	go func() {
		for b := range typed {
			if _, err := ptmx.Write(b); err != nil {
				return
			}
		}
	}()
	defer close(typed)
	r := ptywire.NewReader(os.Stdin)
	for {
		f, err := r.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(os.Stderr, "hutch: terminal input: %v\n", err)
			}
			syscall.Kill(-pgid, syscall.SIGHUP)  //nolint:errcheck // it may have ended
			syscall.Kill(-pgid, syscall.SIGCONT) //nolint:errcheck // as a hangup sends it
			return
		}
		switch f.Kind {
		case ptywire.KindData:
			typed <- append([]byte(nil), f.Data...)
		case ptywire.KindResize:
			// The terminal sends SIGWINCH to its foreground process
			// group.
			pty.Setsize(ptmx, &pty.Winsize{Rows: f.Rows, Cols: f.Cols}) //nolint:errcheck // it may have ended
		case ptywire.KindSignal:
			syscall.Kill(-pgid, syscall.Signal(f.Signal)) //nolint:errcheck // it may have ended
		}
	}
}
