package runsc

import (
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Pipes connect a caller's stdin reader and output writers to a sandboxed
// process that gets host descriptors as its stdio (an exec over the
// control socket, or the init of an attached runsc run): Child are the
// process's ends, the caller's side is copied in constant memory. A nil
// reader or writer gives the process /dev/null instead.
type Pipes struct {
	// Child are the process's stdin, stdout and stderr, to hand to the
	// sandbox and then close with CloseChild.
	Child [3]*os.File

	stdin   io.Reader
	stdinW  *os.File
	sinks   []io.Writer
	outputs []*os.File
	copying sync.WaitGroup
	// lastRead is when output was last read (UnixNano): Finish waits
	// while output still comes.
	lastRead atomic.Int64
}

// NewPipes makes the pipes for stdin, stdout and stderr.
func NewPipes(stdin io.Reader, stdout, stderr io.Writer) (p *Pipes, err error) {
	p = &Pipes{stdin: stdin}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	devnull := func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) }
	if stdin != nil {
		if p.Child[0], p.stdinW, err = os.Pipe(); err != nil {
			return nil, err
		}
	} else if p.Child[0], err = devnull(); err != nil {
		return nil, err
	}
	for i, w := range []io.Writer{stdout, stderr} {
		if w == nil {
			if p.Child[1+i], err = devnull(); err != nil {
				return nil, err
			}
			continue
		}
		r, cw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		p.Child[1+i] = cw
		// gVisor writes to a full host pipe by waiting for it to drain,
		// so a 256 KiB buffer (not 64 KiB) streams faster. Not more: an
		// unprivileged user's pipes share a 64 MiB budget.
		unix.FcntlInt(cw.Fd(), unix.F_SETPIPE_SZ, 256<<10) //nolint:errcheck // a larger buffer is only faster
		p.sinks, p.outputs = append(p.sinks, w), append(p.outputs, r)
	}
	return p, nil
}

// Start starts copying: stdin into the process until it ends or the
// process stops reading, the outputs out until they end (Finish).
func (p *Pipes) Start() {
	for i, r := range p.outputs {
		w := p.sinks[i]
		p.copying.Add(1)
		go func() {
			defer p.copying.Done()
			io.Copy(w, progressReader{r, &p.lastRead}) //nolint:errcheck // the writer's failure ends the copy
		}()
	}
	if p.stdinW != nil {
		go func() {
			io.Copy(p.stdinW, p.stdin) //nolint:errcheck // the process may stop reading
			p.stdinW.Close()
		}()
	}
}

// CloseStdin gives the process EOF on stdin, whatever the caller's reader
// still holds.
func (p *Pipes) CloseStdin() {
	if p.stdinW != nil {
		p.stdinW.Close()
	}
}

// CloseChild closes the process's ends here, once the sandbox holds them
// (or never will): the outputs end when the process's copies close.
func (p *Pipes) CloseChild() {
	for i, f := range p.Child {
		if f != nil {
			f.Close()
			p.Child[i] = nil
		}
	}
}

// stuckDrain bounds how long Finish waits for output that sits in a pipe
// while nothing reads it (the caller's writer is stuck).
const stuckDrain = 10 * time.Second

// Finish waits until the outputs have been copied to their end, then
// stops reading them. A background child of the process may hold them
// open forever, so it stops earlier once nothing has been read for drain
// and nothing is left in the pipes; output still in a pipe is waited for
// while it is read, for up to stuckDrain without progress. The process's
// output is thus never cut because the host was too busy to copy it in
// time.
func (p *Pipes) Finish(drain time.Duration) {
	copied := make(chan struct{})
	go func() {
		p.copying.Wait()
		close(copied)
	}()
	start := time.Now().UnixNano()
	tick := time.NewTicker(min(drain, 20*time.Millisecond))
	defer tick.Stop()
wait:
	for {
		select {
		case <-copied:
			break wait
		case <-tick.C:
		}
		idle := time.Duration(time.Now().UnixNano() - max(start, p.lastRead.Load()))
		if idle >= drain && (!p.pending() || idle >= max(drain, stuckDrain)) {
			break
		}
	}
	for _, r := range p.outputs {
		r.Close()
	}
}

// pending tells whether output waits in a pipe.
func (p *Pipes) pending() bool {
	for _, r := range p.outputs {
		rc, err := r.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		rc.Control(func(fd uintptr) { //nolint:errcheck // a closed pipe has nothing pending
			n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
		})
		if n > 0 {
			return true
		}
	}
	return false
}

// progressReader records when its reader last returned data.
type progressReader struct {
	r    io.Reader
	last *atomic.Int64
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// Close releases every descriptor of pipes whose process never ran.
func (p *Pipes) Close() {
	p.CloseChild()
	for _, r := range p.outputs {
		r.Close()
	}
	if p.stdinW != nil {
		p.stdinW.Close()
	}
}
