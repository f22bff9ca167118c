package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/console"
	"github.com/containerd/fifo"
	runc "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"hutch.dev/hutch/runsc"
)

// stdio is the containerd side of a process's stdio: fifo (or file) paths
// from the task API.
type stdio struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

// openOutput opens a stdout or stderr destination: a fifo containerd
// reads, or a file (file:// URI or plain path) appended to.
func openOutput(ctx context.Context, p string) (io.WriteCloser, error) {
	if p == "" {
		return nil, nil
	}
	if u, err := url.Parse(p); err == nil && u.Scheme != "" {
		if u.Scheme != "file" {
			return nil, fmt.Errorf("stdio %q: only fifos and file:// are supported", p)
		}
		return os.OpenFile(u.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	}
	if ok, err := fifo.IsFifo(p); err != nil || !ok {
		return os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	}
	return fifo.OpenFifo(ctx, p, syscall.O_WRONLY, 0)
}

func openInput(p string) (io.ReadCloser, error) {
	if p == "" {
		return nil, nil
	}
	return fifo.OpenFifo(context.Background(), p, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// pipeIO connects a sandboxed process's stdio to containerd's fifos
// through pipes the shim owns (runsc.Pipes, as hutch's own execs do): runsc
// writes to a regular file at offsets of its own, and a fifo handed over
// directly could not be closed by CloseIO.
type pipeIO struct {
	pipes *runsc.Pipes
	// The process's ends, handed to runsc and closed once it has them.
	procIn, procOut, procErr *os.File
	// containerd's fifos.
	fifos []io.Closer
	// stdinEOF is closed when the stdin fifo has been read to its end.
	stdinEOF chan struct{}
}

// stdinDrain bounds how long CloseIO waits for what is still in the stdin
// fifo to reach the process.
const stdinDrain = 2 * time.Second

// eofReader closes eof when its reader ends.
type eofReader struct {
	r    io.Reader
	eof  chan struct{}
	once sync.Once
}

func (e *eofReader) Read(b []byte) (int, error) {
	n, err := e.r.Read(b)
	if err != nil {
		e.once.Do(func() { close(e.eof) })
	}
	return n, err
}

func newPipeIO(ctx context.Context, s stdio) (_ *pipeIO, err error) {
	p := &pipeIO{}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	var in io.Reader
	var outs [2]io.Writer
	for i, path := range []string{s.Stdout, s.Stderr} {
		if path == "" {
			continue
		}
		w, err := openOutput(ctx, path)
		if err != nil {
			return nil, err
		}
		p.fifos, outs[i] = append(p.fifos, w), w
	}
	if s.Stdin != "" {
		r, err := openInput(s.Stdin)
		if err != nil {
			return nil, err
		}
		p.stdinEOF = make(chan struct{})
		p.fifos, in = append(p.fifos, r), &eofReader{r: r, eof: p.stdinEOF}
	}
	if p.pipes, err = runsc.NewPipes(in, outs[0], outs[1]); err != nil {
		return nil, err
	}
	p.procIn, p.procOut, p.procErr = p.pipes.Child[0], p.pipes.Child[1], p.pipes.Child[2]
	p.pipes.Start()
	return p, nil
}

// closeProcessEnds closes the shim's copies of the process's ends, once
// runsc has passed them into the sandbox, so that output reaches EOF when
// the process is gone.
func (p *pipeIO) closeProcessEnds() {
	if p.pipes != nil {
		p.pipes.CloseChild()
	}
}

// CloseStdin gives the process EOF on stdin (containerd's CloseIO), once
// what the stdin fifo still holds has reached it: containerd closes its
// end after its last write and then calls CloseIO, so the copy usually
// ends on its own; cutting it at once lost the tail of the input
// (kubectl cp: "tar: short read").
func (p *pipeIO) CloseStdin() {
	if p.stdinEOF != nil {
		select {
		case <-p.stdinEOF:
		case <-time.After(stdinDrain):
		}
	}
	if p.pipes != nil {
		p.pipes.CloseStdin()
	}
}

// Drain lets the output reach containerd (a sandbox may keep a dead
// process's output open: runsc.Pipes.Finish stops once nothing comes for
// d), then closes containerd's fifos.
func (p *pipeIO) Drain(d time.Duration) {
	if p.pipes != nil {
		p.pipes.Finish(d)
	}
	p.Close()
}

// Close ends every copy and closes containerd's fifos.
func (p *pipeIO) Close() {
	if p.pipes != nil {
		p.pipes.Close()
	}
	for _, f := range p.fifos {
		f.Close()
	}
	p.fifos = nil
}

// ttyIO is a process's terminal: a host pty master copied to and from
// containerd's fifos, or (agent set) a pty of the sandbox's own that the
// agent holds (agentpty.go).
type ttyIO struct {
	con   console.Console // nil with agent
	agent *agentRelay
	in    io.Closer
	wg    sync.WaitGroup
	once  sync.Once

	mu     sync.Mutex // guards closed
	closed bool
}

// newConsoleSocket makes the socket runsc sends a pty master to.
func newConsoleSocket() (*runc.Socket, error) {
	return runc.NewTempConsoleSocket()
}

// receiveTTY takes the pty master runsc sends on sock and starts copying.
func receiveTTY(ctx context.Context, sock *runc.Socket, s stdio) (*ttyIO, error) {
	type res struct {
		c   console.Console
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := sock.ReceiveMaster()
		ch <- res{c, err}
	}()
	var con console.Console
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("receive pty master: %w", r.err)
		}
		con = r.c
	case <-time.After(30 * time.Second):
		sock.Close()
		return nil, errors.New("receive pty master: timed out")
	}
	return copyTTY(ctx, con, s)
}

// newPty makes a pty pair: the master the shim copies, and the replica
// runsc exec takes as its terminal.
func newPty() (console.Console, *os.File, error) {
	con, path, err := console.NewPty()
	if err != nil {
		return nil, nil, err
	}
	replica, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		con.Close()
		return nil, nil, err
	}
	return con, replica, nil
}

// copyTTY copies between the pty master con and containerd's fifos.
func copyTTY(ctx context.Context, con console.Console, s stdio) (*ttyIO, error) {
	t := &ttyIO{con: con}
	if s.Stdin != "" {
		in, err := openInput(s.Stdin)
		if err != nil {
			con.Close()
			return nil, err
		}
		t.in = in
		go io.Copy(con, in) //nolint:errcheck // ends with CloseIO or the pty
	}
	if s.Stdout != "" {
		w, err := openOutput(ctx, s.Stdout)
		if err != nil {
			t.Close()
			return nil, err
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			// A pty master reads EIO once the last slave is closed.
			io.Copy(w, con) //nolint:errcheck // see above
			w.Close()
		}()
	}
	return t, nil
}

// Resize sets the pty's window size. A resize that arrives after the
// process exited (and its pty was closed) has nothing left to resize.
func (t *ttyIO) Resize(w, h uint32) error {
	if t.agent != nil {
		// Not under mu: the frame waits while the agent is not reading,
		// and Close ends the wait.
		if err := t.agent.resize(w, h); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return err
		}
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	return t.con.Resize(console.WinSize{Width: uint16(w), Height: uint16(h)})
}

// CloseStdin stops feeding input to the pty.
func (t *ttyIO) CloseStdin() {
	if t.in != nil {
		t.in.Close()
	}
}

// Drain waits up to d for output to end, then closes the pty.
func (t *ttyIO) Drain(d time.Duration) {
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Close()
		<-done
	}
	t.Close()
}

// Close closes the pty master (or the agent's frames) and stdin.
func (t *ttyIO) Close() {
	t.once.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.CloseStdin()
		if t.agent != nil {
			t.agent.close()
			return
		}
		if err := t.con.Close(); err != nil {
			log.L.WithError(err).Debug("close pty master")
		}
	})
}
