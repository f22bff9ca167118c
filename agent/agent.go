// Package agent is hutch's init inside a sandbox: PID 1 of every sandbox, a
// small static program bind-mounted read-only at wire.MountPath.
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
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"hutch.dev/hutch/agent/wire"
)

// subcommands are the agent's modes besides init and lookpath, by name;
// each file that adds one registers it in an init function.
var subcommands = map[string]func(args []string) int{}

// Main runs the agent with os.Args and exits.
func Main() {
	if len(os.Args) > 1 && subcommands[os.Args[1]] != nil {
		os.Exit(subcommands[os.Args[1]](os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == wire.ModeLookPath {
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: hutch-init lookpath NAME")
			os.Exit(2)
		}
		os.Exit(LookPath(os.Args[2]))
	}
	if len(os.Args) > 1 && os.Args[1] == wire.CmdWriteSecrets {
		os.Exit(writeSecrets(os.Stdin))
	}
	if len(os.Args) > 1 && os.Args[1] == wire.CmdWithSecrets {
		os.Exit(withSecrets(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == wire.ModeSpawn {
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
			return wire.StatusFound
		case errors.Is(err, fs.ErrPermission):
			return wire.StatusNotExecutable
		default:
			// exec.LookPath skips files without x bits; a file that
			// exists on PATH but is not executable is still a 126.
			for _, dir := range strings.Split(os.Getenv("PATH"), ":") {
				if dir == "" {
					dir = "."
				}
				if fi, err := os.Stat(dir + "/" + name); err == nil && !fi.IsDir() {
					return wire.StatusNotExecutable
				}
			}
			return wire.StatusNotFound
		}
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return wire.StatusNotFound
	case err != nil:
		return wire.StatusNotExecutable
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		return wire.StatusNotExecutable
	}
	return wire.StatusFound
}

// initLoop is PID 1: it reaps every child that is reparented to it and
// returns when asked to stop.
func initLoop() int {
	// The init's stdout and stderr are the sandbox log, a file on the
	// host: not dumpable, the init's /proc/1/fd is closed to the
	// sandbox's processes (they lack CAP_SYS_PTRACE), so that only the
	// init writes the log, under its cap (see cappedLog).
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		fmt.Fprintln(os.Stderr, "hutch-init: prctl(PR_SET_DUMPABLE):", errno)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	ensureHosts()
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
		if !netListener.exited(pid, ws) {
			childExited(pid, ws)
		}
	}
}

// The sandbox log is the init's stdout: a file on the host that the
// sandbox's own disk limit does not count, written by the init for every
// line a background process prints. The init keeps it under logMax: when a
// line would take it past, it empties the file and starts it again with
// a note and the last logKeep bytes, so the newest lines always remain and
// a process printing without end costs the host at most logMax.
const (
	logMax  = 8 << 20
	logKeep = 1 << 20
)

// sandboxLog is where logLine writes.
var sandboxLog = &cappedLog{f: os.Stdout, max: logMax, keep: logKeep}

// cappedLog is a log file that never grows past max bytes (see logMax).
// Writes to it are whole lines; one longer than keep is cut to keep.
type cappedLog struct {
	f         *os.File
	max, keep int64

	mu      sync.Mutex
	size    int64 // of f, -1: not a regular file, never cut
	statted bool
	tail    []byte // the last keep bytes written, from a line start
}

func (l *cappedLog) Write(p []byte) (int, error) {
	n := len(p)
	if int64(len(p)) > l.keep {
		p = append(p[:l.keep-1:l.keep-1], '\n')
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.statted {
		l.statted, l.size = true, l.fileSize()
	}
	if l.size >= 0 && l.size+int64(len(p)) > l.max {
		// The file may have been replaced since (restore, fork): cut
		// only what is really there.
		if l.size = l.fileSize(); l.size+int64(len(p)) > l.max {
			if err := l.cut(); err != nil {
				return n, nil // full and cannot be cut: the line is lost
			}
		}
	}
	if _, err := l.f.Write(p); err != nil {
		return n, err
	}
	if l.size >= 0 {
		l.size += int64(len(p))
	}
	l.tail = append(l.tail, p...)
	if int64(len(l.tail)) > 2*l.keep {
		l.tail = trimToLine(l.tail, l.keep)
	}
	return n, nil
}

// cut empties the file and writes a note and the tail back.
func (l *cappedLog) cut() error {
	if err := l.f.Truncate(0); err != nil {
		return err
	}
	l.tail = trimToLine(l.tail, l.keep)
	note := fmt.Sprintf("%s init log over %d bytes: older lines dropped\n", time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"), l.max)
	// In one write: a reader of the file (hutch logs) finds it empty
	// for as short a time as can be.
	k, err := l.f.Write(append([]byte(note), l.tail...))
	l.size = int64(k)
	return err
}

// fileSize is the size of l's file, or -1 unless it is a regular file.
func (l *cappedLog) fileSize() int64 {
	fi, err := l.f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return -1
	}
	return fi.Size()
}

// trimToLine keeps at most the last keep bytes of b, from a line start.
func trimToLine(b []byte, keep int64) []byte {
	if int64(len(b)) <= keep {
		return b
	}
	b = b[int64(len(b))-keep:]
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	} else {
		b = b[:0]
	}
	return append([]byte(nil), b...)
}
