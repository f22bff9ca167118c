package agent

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"hutch.dev/hutch/agent/agentnet"
	"hutch.dev/hutch/agent/wire"
)

// The agent's network endpoint: "hutch-init listen" is the init of a
// sandbox that a server off its host drives over the network (a pod of
// hutch serve's Kubernetes placement). It takes the sandbox's key from
// agentnet.EnvKey, removes it from its environment, starts the listener
// ("hutch-init listen-serve", the key on its stdin) and goes on as the
// init. The listener takes authenticated connections on agentnet.Port,
// each running one command as runsc exec would (see package agentnet):
// its children are its own to wait for, so that the init's reaping never
// takes their exit statuses; what they leave behind goes to the init.
// When the listener ends (a crash, or a process of the sandbox killing
// it), the init, which keeps the key, starts it again.

func init() {
	subcommands[wire.ModeListen] = listenInit
	subcommands[wire.ModeListenServe] = listenServe
}

// listenInit is "hutch-init listen": the init, with the endpoint on.
func listenInit(args []string) int {
	key := os.Getenv(agentnet.EnvKey)
	os.Unsetenv(agentnet.EnvKey)
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "usage: hutch-init listen (the key in $"+agentnet.EnvKey+")")
		return 2
	}
	if _, err := parseKey(key); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init: no network endpoint:", err)
		return initLoop()
	}
	netListener.mu.Lock()
	netListener.key = key
	if err := netListener.start(); err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init: no network endpoint:", err)
	}
	netListener.mu.Unlock()
	return initLoop()
}

// netListener is the listener the init keeps running.
var netListener listener

type listener struct {
	mu sync.Mutex
	// key is the sandbox's key; "": no endpoint.
	key     string
	pid     int
	started time.Time
}

// listenerRestartDelay is how long the init waits before starting again a
// listener that ended within listenerMinLife of its start.
const (
	listenerRestartDelay = time.Second
	listenerMinLife      = 5 * time.Second
)

// start starts the listener process with the key on its stdin; the init
// reaps it (initLoop). l.mu is held, so that the reaper knows its PID
// before it can exit.
func (l *listener) start() error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	if _, err := io.WriteString(w, l.key); err != nil {
		w.Close()
		return err
	}
	w.Close()
	cmd := exec.Command(wire.MountPath, "listen-serve")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	l.pid, l.started = cmd.Process.Pid, time.Now()
	return nil
}

// exited tells whether pid was the listener; if so, it starts it again
// (after listenerRestartDelay if it lived less than listenerMinLife, so
// that one that cannot run does not spin).
func (l *listener) exited(pid int, ws syscall.WaitStatus) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.key == "" || pid != l.pid {
		return false
	}
	l.pid = 0
	logLine("init", fmt.Sprintf("network endpoint %d ended (status %d, signal %d); starting it again", pid, ws.ExitStatus(), ws.Signal()))
	var delay time.Duration
	if time.Since(l.started) < listenerMinLife {
		delay = listenerRestartDelay
	}
	time.AfterFunc(delay, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if err := l.start(); err != nil {
			logLine("init", "network endpoint: "+err.Error())
		}
	})
	return true
}

func parseKey(s string) ([]byte, error) {
	k, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(k) != agentnet.KeySize {
		return nil, fmt.Errorf("$%s: want %d hex digits", agentnet.EnvKey, 2*agentnet.KeySize)
	}
	return k, nil
}

// listenServe is "hutch-init listen-serve": the listener.
func listenServe(args []string) int {
	b, err := io.ReadAll(io.LimitReader(os.Stdin, 256))
	os.Stdin.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init listen-serve: read the key:", err)
		return 1
	}
	key, err := parseKey(string(b))
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init listen-serve:", err)
		return 2
	}
	// The key is in this process's memory: closed to the sandbox's
	// processes (ptrace, /proc/PID/mem) as the init's is.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		fmt.Fprintln(os.Stderr, "hutch-init listen-serve: prctl(PR_SET_DUMPABLE):", errno)
		return 1
	}
	port := agentnet.Port
	if len(args) == 1 {
		if port, err = strconv.Atoi(args[0]); err != nil {
			fmt.Fprintln(os.Stderr, "usage: hutch-init listen-serve [PORT]")
			return 2
		}
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "hutch-init listen-serve:", err)
		return 1
	}
	return serveEndpoint(ln, key)
}

// serveEndpoint takes connections on ln until it fails.
func serveEndpoint(ln net.Listener, key []byte) int {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			fmt.Fprintln(os.Stderr, "hutch-init listen-serve:", err)
			return 1
		}
		go endpointConn(c, key)
	}
}

// endpointConn serves one connection: a client that does not prove the
// key is dropped before anything runs.
func endpointConn(nc net.Conn, key []byte) {
	defer nc.Close()
	c, err := agentnet.Server(nc, key)
	if err != nil {
		return
	}
	ch, p, err := c.ReadFrame()
	if err != nil || ch != agentnet.ChanRequest {
		return
	}
	var req agentnet.Request
	if err := json.Unmarshal(p, &req); err != nil || (len(req.Args) == 0) == (req.Port == 0) || req.Port < 0 || req.Port > 65535 {
		sendStatus(c, agentnet.Status{Code: -1, Error: "malformed request"})
		return
	}
	if req.Port != 0 {
		sendStatus(c, joinPort(c, req.Port))
		return
	}
	sendStatus(c, runEndpoint(c, req))
}

// joinPort joins c to port on the sandbox's loopback until the port's
// end closes.
func joinPort(c *agentnet.Conn, port int) agentnet.Status {
	tc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return agentnet.Status{Code: -1, Error: err.Error()}
	}
	defer tc.Close()
	if err := c.WriteFrame(agentnet.ChanConnected, nil); err != nil {
		return agentnet.Status{}
	}
	go func() {
		for {
			ch, p, err := c.ReadFrame()
			if err != nil {
				tc.Close()
				return
			}
			switch ch {
			case agentnet.ChanStdin:
				if _, err := tc.Write(p); err != nil {
					return
				}
			case agentnet.ChanStdinClose:
				if cw, ok := tc.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite() //nolint:errcheck // the port may be gone
				}
			}
		}
	}()
	io.Copy(netFrameWriter{c, agentnet.ChanStdout}, tc) //nolint:errcheck // either end gone ends it
	return agentnet.Status{}
}

func sendStatus(c *agentnet.Conn, st agentnet.Status) {
	b, _ := json.Marshal(st)
	c.WriteFrame(agentnet.ChanStatus, b) //nolint:errcheck // the client is gone
}

// netFrameWriter writes on one channel of c.
type netFrameWriter struct {
	c  *agentnet.Conn
	ch byte
}

func (w netFrameWriter) Write(p []byte) (int, error) {
	if err := w.c.WriteFrame(w.ch, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// runEndpoint runs req with its input and output on c.
func runEndpoint(c *agentnet.Conn, req agentnet.Request) agentnet.Status {
	cmd := exec.Command(req.Args[0], req.Args[1:]...)
	cmd.Stdout = netFrameWriter{c, agentnet.ChanStdout}
	cmd.Stderr = netFrameWriter{c, agentnet.ChanStderr}
	var stdinW *os.File
	if req.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return agentnet.Status{Code: -1, Error: err.Error()}
		}
		cmd.Stdin, stdinW = r, w
	}
	err := cmd.Start()
	if stdinW != nil {
		cmd.Stdin.(*os.File).Close()
	}
	if err != nil {
		if stdinW != nil {
			stdinW.Close()
		}
		return agentnet.Status{Code: -1, Error: err.Error()}
	}
	if stdinW != nil {
		go func() {
			defer stdinW.Close()
			for {
				ch, p, err := c.ReadFrame()
				if err != nil || ch == agentnet.ChanStdinClose {
					return
				}
				if ch == agentnet.ChanStdin {
					if _, err := stdinW.Write(p); err != nil {
						return
					}
				}
			}
		}()
	}
	err = cmd.Wait()
	var xe *exec.ExitError
	switch {
	case err == nil:
		return agentnet.Status{}
	case errors.As(err, &xe):
		if ws, ok := xe.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return agentnet.Status{Code: 128 + int(ws.Signal())}
		}
		return agentnet.Status{Code: xe.ExitCode()}
	default:
		// The output could not be sent: the client is gone.
		return agentnet.Status{Code: cmd.ProcessState.ExitCode()}
	}
}
