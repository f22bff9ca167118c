package kubeplace

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/agent/ptywire"
	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/kube"
	"hutch.dev/hutch/serve/placement"
)

// The data plane on Kubernetes placement: every command and file
// operation is one stream to the sandbox's agent, through its network
// endpoint (agent.go) or, for a sandbox without network, pods/exec. A command runs
// through the image's /bin/sh (E2B's SDKs run theirs through /bin/bash
// anyway), which reports its PID, sets the request's environment and
// working directory and execs the command: the PID is the command's, so
// that a signal reaches it through a second exec. Files go through the
// agent's file modes (cat, write, stat), as the engine's do.

// kubeExecScript is $0's script: "hutch-pid PID" on stderr, then N
// variables, the working directory ("" for the pod's) and the command.
const kubeExecScript = `printf 'hutch-pid %d\n' $$ >&2
n=$1; shift
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done
if [ -n "$1" ]; then cd -- "$1" || exit 1; fi
shift
exec "$@"`

// kubeExecArgs is the exec's command line for req.
func kubeExecArgs(req engine.ExecRequest) []string {
	args := []string{"/bin/sh", "-c", kubeExecScript, "hutch-exec", strconv.Itoa(len(req.Env))}
	args = append(args, req.Env...)
	return append(append(args, req.Workdir), req.Args...)
}

// kubePtyArgs runs argv through the agent's pty mode on a terminal of
// size (zero: the pty's default).
func kubePtyArgs(size engine.WinSize, argv []string) []string {
	args := []string{engine.AgentPath, wire.ModePty}
	if size.Rows > 0 && size.Cols > 0 {
		args = append(args, "--size", strconv.Itoa(int(size.Rows))+"x"+strconv.Itoa(int(size.Cols)))
	}
	return append(append(args, "--"), argv...)
}

// kubeCommand is a command running in a pod.
type kubeCommand struct {
	k       *Placement
	pod     string
	pid     int
	timeout time.Duration
	done    chan struct{}
	// term, for a command on a terminal, writes the agent's pty frames:
	// input, sizes, signals.
	term *ptywire.Writer

	// mu guards code, err and timedOut.
	mu       sync.Mutex
	code     int
	err      error
	timedOut bool
}

func (c *kubeCommand) Pid() int { return c.pid }

// Signal sends sig to the command through a second exec.
func (c *kubeCommand) Signal(sig os.Signal) error {
	n, ok := sig.(syscall.Signal)
	if !ok || c.pid <= 0 {
		return fmt.Errorf("signal %v: %w", sig, errdefs.ErrInvalidArgument)
	}
	if c.term != nil {
		// The terminal's process group, through the agent's pty mode.
		select {
		case <-c.done:
			return fmt.Errorf("signal process %d: it has ended: %w", c.pid, errdefs.ErrNotFound)
		default:
		}
		return c.term.Signal(int(n))
	}
	var stderr bytes.Buffer
	code, err := c.k.exec(context.Background(), kube.ExecRequest{
		Namespace: c.k.cfg.Namespace, Pod: c.pod, Container: kubeContainer,
		Args:   []string{"/bin/sh", "-c", "kill -" + strconv.Itoa(int(n)) + " " + strconv.Itoa(c.pid)},
		Stderr: &stderr,
	})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("signal process %d: %s: %w", c.pid, strings.TrimSpace(stderr.String()), errdefs.ErrNotFound)
	}
	return nil
}

func (c *kubeCommand) Resize(size engine.WinSize) error {
	if c.term == nil {
		return fmt.Errorf("process %d has no terminal: %w", c.pid, errdefs.ErrFailedPrecondition)
	}
	return c.term.Resize(size.Rows, size.Cols)
}

func (c *kubeCommand) Wait() (int, error) {
	var timer <-chan time.Time
	if c.timeout > 0 {
		t := time.NewTimer(c.timeout)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-c.done:
	case <-timer:
		c.mu.Lock()
		c.timedOut = true
		c.mu.Unlock()
		c.Signal(syscall.SIGKILL) //nolint:errcheck // it may have ended meanwhile
		<-c.done
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timedOut {
		return engine.ExitTimeout, engine.ErrTimeout
	}
	return c.code, c.err
}

// pidWriter passes stderr on after its first line, the script's PID.
type pidWriter struct {
	next io.Writer
	line []byte
	got  bool
	pid  chan<- int
}

func (w *pidWriter) Write(p []byte) (int, error) {
	if w.got {
		if w.next == nil {
			return len(p), nil
		}
		return w.next.Write(p)
	}
	n := len(p)
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		w.line = append(w.line, p...)
		if len(w.line) > 64 {
			return 0, fmt.Errorf("exec: the command's wrapper did not report its PID")
		}
		return n, nil
	}
	w.line = append(w.line, p[:i]...)
	w.got = true
	pid, _ := strconv.Atoi(strings.TrimPrefix(string(w.line), "hutch-pid "))
	w.pid <- pid
	if rest := p[i+1:]; len(rest) > 0 && w.next != nil {
		if _, err := w.next.Write(rest); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// start starts req in sandbox id's pod; it returns once the command
// runs (or has ended).
func (k *Placement) start(ctx context.Context, id string, req engine.ExecRequest) (placement.Command, error) {
	if req.User != "" && req.User != placement.DefaultUser {
		// The pod's user runs everything: say so rather than run as
		// someone else than asked.
		if req.User != "root" {
			return nil, fmt.Errorf("user %q: commands on Kubernetes placement run as the pod's user (ask for %q or root): %w", req.User, placement.DefaultUser, errdefs.ErrNotImplemented)
		}
	}
	pidc := make(chan int, 1)
	c := &kubeCommand{k: k, pod: kubePodName(id), timeout: req.Timeout, done: make(chan struct{})}
	xreq := kube.ExecRequest{
		Namespace: k.cfg.Namespace, Pod: c.pod, Container: kubeContainer,
		Args: kubeExecArgs(req), Stdout: req.Stdout,
		Stderr: &pidWriter{next: req.Stderr, pid: pidc},
	}
	if req.Stdin != nil {
		xreq.Stdin = req.Stdin
	}
	var pr *io.PipeReader
	if req.TTY {
		// The agent's pty mode: what is typed goes in data frames, the
		// end of the input hangs the terminal up.
		treq := req
		treq.Args = kubePtyArgs(req.Size, req.Args)
		if !slices.ContainsFunc(req.Env, func(e string) bool { return strings.HasPrefix(e, "TERM=") }) {
			treq.Env = append(slices.Clip(req.Env), "TERM=xterm")
		}
		xreq.Args = kubeExecArgs(treq)
		var pw *io.PipeWriter
		pr, pw = io.Pipe()
		c.term = ptywire.NewWriter(pw)
		xreq.Stdin = pr
		go func() {
			buf := make([]byte, ptywire.MaxData)
			for req.Stdin != nil {
				n, err := req.Stdin.Read(buf)
				if n > 0 && c.term.Data(buf[:n]) != nil {
					break
				}
				if err != nil {
					break
				}
			}
			pw.Close()
		}()
	}
	go func() {
		code, err := k.exec(ctx, xreq)
		if pr != nil {
			// Frames for an ended terminal fail rather than wait.
			pr.CloseWithError(fmt.Errorf("process has ended: %w", errdefs.ErrNotFound))
		}
		if errors.Is(err, kube.ErrExecFailed) {
			err = fmt.Errorf("the image of sandbox %s has no /bin/sh, which runs commands on Kubernetes placement: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		}
		c.mu.Lock()
		c.code, c.err = code, err
		c.mu.Unlock()
		close(c.done)
	}()
	select {
	case c.pid = <-pidc:
		return c, nil
	case <-c.done:
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// agentRun runs the agent with args in sandbox id's pod, as the engine's
// agentRun does through runsc exec, turning its status into an error of
// its kind.
func (k *Placement) agentRun(ctx context.Context, id string, args []string, stdin io.Reader, stdout io.Writer) error {
	var stderr bytes.Buffer
	code, err := k.exec(ctx, kube.ExecRequest{
		Namespace: k.cfg.Namespace, Pod: kubePodName(id), Container: kubeContainer,
		Args: append([]string{engine.AgentPath}, args...), Stdin: stdin, Stdout: stdout, Stderr: &limitedBuffer{b: &stderr, n: 4096},
	})
	if err != nil {
		return err
	}
	if code == 0 {
		return nil
	}
	return engine.AgentError(id, code, stderr.String())
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// home is the pod user's home directory (HOME in the pod, "/" if unset).
func (k *Placement) home(ctx context.Context, id string) string {
	var out bytes.Buffer
	code, err := k.exec(ctx, kube.ExecRequest{
		Namespace: k.cfg.Namespace, Pod: kubePodName(id), Container: kubeContainer,
		Args: []string{"/bin/sh", "-c", `printf %s "$HOME"`}, Stdout: &out,
	})
	if err != nil || code != 0 || !strings.HasPrefix(out.String(), "/") {
		return "/"
	}
	return out.String()
}

// Processes runs envd's commands through the agent's endpoint or
// pods/exec, as the pod's user; there is no supervisor.
func (k *Placement) Processes() placement.Processes {
	return placement.Processes{
		Start: k.start,
		Stat: func(ctx context.Context, id, path string) error {
			return k.agentRun(ctx, id, []string{wire.ModeStat, path}, nil, nil)
		},
		Home: func(ctx context.Context, id, _ string) (string, error) {
			return k.home(ctx, id), nil
		},
	}
}

// Files reaches the pod's files as the pod's user: GET streams a file
// out of the pod (agent cat), POST writes one (agent write).
func (k *Placement) Files(_ context.Context, id string, u placement.FileUser) (placement.Files, error) {
	if u.Named != "" && u.Named != placement.DefaultUser && u.Named != "root" {
		return nil, fmt.Errorf("user %q: files on Kubernetes placement are the pod's user's (ask for %q or root): %w", u.Named, placement.DefaultUser, errdefs.ErrNotImplemented)
	}
	return podFiles{k: k, id: id}, nil
}

// podFiles are the files of sandbox id's pod.
type podFiles struct {
	k  *Placement
	id string
}

func (f podFiles) Home(ctx context.Context) (string, error) { return f.k.home(ctx, f.id), nil }

func (f podFiles) Read(ctx context.Context, path string, w io.Writer) error {
	return f.k.agentRun(ctx, f.id, []string{wire.ModeCat, path}, nil, w)
}

func (f podFiles) Write(ctx context.Context, path string, data io.Reader, meta map[string]string) (map[string]string, error) {
	if meta == nil {
		meta = map[string]string{}
	}
	args, err := wire.WriteArgs(path, 0o644, true, nil, meta)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := f.k.agentRun(ctx, f.id, args, data, &out); err != nil {
		return nil, err
	}
	var fi wire.FileInfo
	if err := json.Unmarshal(out.Bytes(), &fi); err != nil {
		return nil, fmt.Errorf("the file written: %w", err)
	}
	return fi.Metadata, nil
}

// NamesDownloads is false: a pod's downloads carry no
// Content-Disposition.
func (f podFiles) NamesDownloads() bool { return false }
