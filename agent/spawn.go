package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
)

// SocketPath is the unix socket inside the sandbox on which the init takes
// spawn requests.
const SocketPath = "/.hutch/agent.sock"

// Background processes must descend from the init to survive a checkpoint
// and restore: processes started by `runsc exec` are killed on restore. So
// `hutch exec -d` runs `hutch-init spawn -- CMD...` through runsc exec; that
// client asks the init over SocketPath to fork and exec CMD, with the
// client's environment and working directory and with the user the kernel
// reports for the client's end of the socket (SO_PEERCRED): a request can
// never start a process with more privileges than its sender. The init
// writes the process's output, one timestamped line at a time, to its own
// stdout (the sandbox's log), reaps it and logs its exit status.

// spawnRequest is what the client sends, as one JSON object.
type spawnRequest struct {
	Args []string `json:"args"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// spawnReply is the init's answer: the PID, or why it could not start the
// process and the shell's status for that (126, 127).
type spawnReply struct {
	Pid    int    `json:"pid,omitempty"`
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

// logMu serialises lines on the init's stdout.
var logMu sync.Mutex

// logLine writes one line to the sandbox log: an RFC 3339 UTC timestamp
// with microseconds, the source ("init" or a PID) and the text.
func logLine(source, text string) {
	logMu.Lock()
	defer logMu.Unlock()
	fmt.Fprintf(sandboxLog, "%s %s %s\n", time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"), source, text)
}

// children are the spawned processes the init has not reaped yet.
var children struct {
	mu   sync.Mutex // guards pids; held across fork so reaping sees the PID
	pids map[int][]string
}

// serve listens on SocketPath and serves spawn requests until the init
// exits. A failure to listen is logged: the sandbox still runs, it only
// cannot start background processes.
func serve() {
	children.pids = map[int][]string{}
	supervised.running = map[int]*superChild{}
	os.Remove(SocketPath)
	l, err := net.Listen("unix", SocketPath)
	if err != nil {
		logLine("init", "cannot take spawn requests: "+err.Error())
		return
	}
	os.Chmod(SocketPath, 0o666) //nolint:errcheck // creds come from SO_PEERCRED
	logLine("init", "started")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			go handle(c.(*net.UnixConn))
		}
	}()
}

// handle serves one connection: a spawn request (JSON, its first byte
// '{') or a supervise request (see supervise.go, its first byte 0).
func handle(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(30 * time.Second))              //nolint:errcheck
	reply := func(r spawnReply) { json.NewEncoder(c).Encode(r) } //nolint:errcheck // the client may be gone
	cred, err := peerCred(c)
	if err != nil {
		reply(spawnReply{Status: 1, Error: "peer credentials: " + err.Error()})
		c.Close()
		return
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(c, first); err != nil {
		c.Close()
		return
	}
	if first[0] != '{' {
		handleSupervise(c, first, cred) // it closes c when done
		return
	}
	defer c.Close()
	var req spawnRequest
	if err := json.NewDecoder(io.MultiReader(bytes.NewReader(first), io.LimitReader(c, 4<<20))).Decode(&req); err != nil || len(req.Args) == 0 {
		reply(spawnReply{Status: 2, Error: "bad spawn request"})
		return
	}
	pid, status, err := spawn(req, cred)
	if err != nil {
		reply(spawnReply{Status: status, Error: err.Error()})
		return
	}
	reply(spawnReply{Pid: pid})
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err == nil {
		err = cerr
	}
	return cred, err
}

// spawn starts req as a child of the init, in a session of its own, with
// its output going to the log.
func spawn(req spawnRequest, cred *unix.Ucred) (int, int, error) {
	path, status, err := resolve(req.Args[0], req.Env, req.Dir)
	if err != nil {
		return 0, status, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, 1, err
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return 0, 1, err
	}
	defer w.Close()
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: []uintptr{devnull.Fd(), w.Fd(), w.Fd()},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: cred.Uid, Gid: cred.Gid, NoSetGroups: cred.Uid == 0},
		},
	}
	children.mu.Lock()
	pid, err := syscall.ForkExec(path, req.Args, attr)
	if err == nil {
		children.pids[pid] = req.Args
	}
	children.mu.Unlock()
	if err != nil {
		r.Close()
		st := wire.StatusNotExecutable
		if errors.Is(err, syscall.ENOENT) {
			st = wire.StatusNotFound
		}
		return 0, st, fmt.Errorf("%s: %w", req.Args[0], err)
	}
	src := fmt.Sprint(pid)
	logLine("init", fmt.Sprintf("started %s: %s", src, strings.Join(req.Args, " ")))
	go copyLines(src, r)
	return pid, 0, nil
}

// resolve finds the executable as the shell would, with PATH from env and
// relative paths from dir.
func resolve(name string, env []string, dir string) (string, int, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		st, err := checkExec(p, name)
		return p, st, err
	}
	pathEnv := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	found := ""
	for _, d := range strings.Split(pathEnv, ":") {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Mode().Perm()&0o111 != 0 {
			return p, 0, nil
		}
		if found == "" {
			found = p
		}
	}
	if found != "" {
		return "", wire.StatusNotExecutable, fmt.Errorf("%s: permission denied", name)
	}
	return "", wire.StatusNotFound, fmt.Errorf("%s: command not found", name)
}

func checkExec(p, name string) (int, error) {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return wire.StatusNotFound, fmt.Errorf("%s: no such file or directory", name)
	case err != nil:
		return wire.StatusNotExecutable, fmt.Errorf("%s: %w", name, err)
	case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
		return wire.StatusNotExecutable, fmt.Errorf("%s: permission denied", name)
	}
	return 0, nil
}

// copyLines logs every line read from r under source. Over-long lines are
// split at 64 KiB.
func copyLines(source string, r *os.File) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			logLine(source, strings.TrimSuffix(string(line), "\n"))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// childExited logs the exit of a spawned process, or records that of a
// supervised one; the init calls it for every child it reaps.
func childExited(pid int, ws syscall.WaitStatus) {
	// Taking the lock waits for a fork that is still registering pid.
	children.mu.Lock()
	_, ok := children.pids[pid]
	delete(children.pids, pid)
	children.mu.Unlock()
	if !ok {
		supervisedExited(pid, ws)
		return
	}
	if ws.Signaled() {
		logLine("init", fmt.Sprintf("%d exited: killed by signal %d", pid, ws.Signal()))
		return
	}
	logLine("init", fmt.Sprintf("%d exited with status %d", pid, ws.ExitStatus()))
}

// initStartWait bounds how long a client waits for a starting init to
// take requests: a request can come as soon as the sandbox has started,
// before the init has made its socket.
const initStartWait = 5 * time.Second

// dialInit connects to the init's socket at path, waiting up to wait for
// it to appear, listen and be opened to every user.
func dialInit(path string, wait time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(wait)
	for {
		c, err := net.Dial("unix", path)
		if err == nil || time.Now().After(deadline) ||
			!(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EACCES)) {
			return c, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spawnClient is `hutch-init spawn [--] CMD...`: it asks the init to start
// CMD and prints its PID. Its exit status is 0, or the shell's 126/127
// when CMD cannot be started, or 1 when the init cannot be reached.
func spawnClient(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init spawn -- CMD [ARG...]")
		return 2
	}
	dir, err := os.Getwd()
	if err != nil {
		dir = "/"
	}
	c, err := dialInit(SocketPath, initStartWait)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: cannot reach the sandbox's init: %v\n", err)
		return 1
	}
	defer c.Close()
	if err := json.NewEncoder(c).Encode(spawnRequest{Args: args, Env: os.Environ(), Dir: dir}); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: %v\n", err)
		return 1
	}
	var r spawnReply
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-init: no reply from init: %v\n", err)
		return 1
	}
	if r.Error != "" {
		fmt.Fprintln(os.Stderr, r.Error)
		if r.Status == 0 {
			r.Status = 1
		}
		return r.Status
	}
	fmt.Println(r.Pid)
	return 0
}
