package runsc

import (
	"errors"
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
// process's ends, the caller's side is copied in constant memory (or
// spliced, when the caller's writer is a pipe). The caller's descriptors
// never reach the sandbox: once the process has exited and its output
// drained, nothing it left behind can write to the caller. A nil reader
// or writer gives the process /dev/null instead.
type Pipes struct {
	// Child are the process's stdin, stdout and stderr, to hand to the
	// sandbox and then close with CloseChild.
	Child [3]*os.File
	// Interactive passes output on as soon as it comes: a splice never
	// waits for a streaming output's small writes to gather. Set it
	// before Start.
	Interactive bool

	stdin   io.Reader
	stdinW  *os.File
	sinks   []io.Writer
	outputs []*os.File
	copying sync.WaitGroup
	// wakeR becomes readable (its other end, wakeW, is closed) when the
	// outputs are about to be closed: a splice waiting for data or room
	// gives up.
	wakeR, wakeW *os.File
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
	if p.wakeR, p.wakeW, err = os.Pipe(); err != nil {
		return nil, err
	}
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
		// and the copy wakes less often the more a pipe holds.
		unix.FcntlInt(cw.Fd(), unix.F_SETPIPE_SZ, pipeSize()) //nolint:errcheck // a larger buffer is only faster
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
			p.copyOut(w, r)
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
	p.wakeW.Close()
	for _, r := range p.outputs {
		r.Close()
	}
	p.wakeR.Close()
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
	if p.wakeW != nil {
		p.wakeW.Close()
		p.wakeR.Close()
	}
	p.CloseChild()
	for _, r := range p.outputs {
		r.Close()
	}
	if p.stdinW != nil {
		p.stdinW.Close()
	}
}

// copyBuf is the size of the buffer an output is copied through when it
// cannot be spliced: gVisor writes as much of a large write as the host
// pipe has room for at once, and a larger read means fewer wake-ups of
// the copy.
const copyBuf = 256 << 10

// spliceMax is how much one splice(2) may move.
const spliceMax = 1 << 20

// While output streams (splices less than streaming apart), a splice
// of less than a quarter of the pipe waits batchWait before the next: at
// the 120 MB/s a process writing 4 KiB at a time reaches in gVisor, some
// 240 KiB gather in root's 1 MiB pipe in that time instead of one
// write's worth, and a quarter of an unprivileged user's 256 KiB in a
// quarter of it.
const streaming = 5 * time.Millisecond

// pipeSize is the size given to the pipes output is copied through, and
// at least that of a caller's pipe it is spliced into: 1 MiB for root,
// whose pipes count against no budget; 256 KiB for an unprivileged user,
// whose pipes share a 64 MiB budget past which new ones get 4 KiB.
func pipeSize() int {
	if os.Geteuid() == 0 {
		return 1 << 20
	}
	return 256 << 10
}

// batchWait is how long a splice of a streaming output waits for more.
func batchWait() time.Duration {
	return 2 * time.Millisecond * time.Duration(pipeSize()) / (1 << 20)
}

// copyOut copies the output r to the caller's w until r ends or is
// closed. When w is a pipe, the data moves from one pipe to the other
// inside the kernel (splice(2)): no copy through this process, whose
// memory stays constant either way. Only w's descriptor is used, never
// handed to the sandbox (a caller's regular file, or its offset, is
// no business of runsc's).
func (p *Pipes) copyOut(w io.Writer, r *os.File) {
	if f, ok := w.(*os.File); ok && isPipe(f) {
		if p.splice(f, r) {
			return
		}
	}
	_, err := io.CopyBuffer(noReadFrom{w}, progressReader{r, &p.lastRead}, make([]byte, copyBuf))
	if !ownStdio(w) || !readerGone(err) {
		return
	}
	markLost(w)
	r.Close() // as splice does
	if errors.Is(err, unix.ECONNRESET) {
		// The socket's reader went with data unread: the kernel
		// reports that once, with no SIGPIPE, and EPIPE (which os
		// turns into SIGPIPE) from then on, as splice's write does.
		w.Write([]byte{0}) //nolint:errcheck // it fails: nothing reads w
	}
}

// readerGone tells whether a write's error err means that nothing reads
// what is written any more: a pipe's or a socket's reader has gone. A
// socket whose reader closed it with data unread fails one write with
// ECONNRESET first.
func readerGone(err error) bool {
	return errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET)
}

// lostStdout and lostStderr record that some of a sandbox's output was
// not written to this process's stdout or stderr because its reader had
// gone.
var lostStdout, lostStderr atomic.Bool

func markLost(w io.Writer) {
	if w == io.Writer(os.Stdout) {
		lostStdout.Store(true)
	} else {
		lostStderr.Store(true)
	}
}

// LostOutput returns those of this process's stdout and stderr that lost
// some of a sandbox's output because their reader had gone: a command's
// output that had all been read when its reader went is not lost (`sh -c
// 'echo a; sleep 1' | head -1`). A pipeline's writer that loses output
// ends by SIGPIPE, one that does not exits as it would have.
func LostOutput() []*os.File {
	var lost []*os.File
	if lostStdout.Load() {
		lost = append(lost, os.Stdout)
	}
	if lostStderr.Load() {
		lost = append(lost, os.Stderr)
	}
	return lost
}

// ownStdio tells whether w is this process's stdout or stderr. When its
// reader goes, the process's end of the output is closed, so that its
// writes fail as in a pipeline; other writers' readers may come back (a
// restarted containerd reopens its fifos), and the process goes on.
func ownStdio(w io.Writer) bool {
	return w == io.Writer(os.Stdout) || w == io.Writer(os.Stderr)
}

// noReadFrom hides a writer's ReadFrom, which would copy through its own
// smaller buffer.
type noReadFrom struct{ io.Writer }

// isPipe tells whether f is a pipe (a FIFO).
func isPipe(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode().Type() == os.ModeNamedPipe
}

// splice moves r's data into the pipe dst until r ends or is closed, or
// dst fails. It reports false, having moved nothing, if the kernel
// cannot splice between them: the caller copies instead.
//
// A process streaming in small writes would wake the copy for each:
// while output streams, it sleeps between splices so that the writes
// gather in r, and moves them in one (up to dst's room, which it grows).
// It waits for r's data in Go's poller, and for room in dst (the
// caller's descriptor, left out of Go's poller) in poll(2), which
// Finish and Close wake through p.wake.
func (p *Pipes) splice(dst, r *os.File) bool {
	src, err := r.SyscallConn()
	if err != nil {
		return false
	}
	dc, err := dst.SyscallConn()
	if err != nil {
		return false
	}
	// dst is the caller's and stays open while the process runs; its
	// descriptor is only used here, outside its own poller, which is
	// left alone (Fd would make it blocking).
	dfd := -1
	dc.Control(func(fd uintptr) { dfd = int(fd) }) //nolint:errcheck // dfd stays -1
	if dfd < 0 {
		return false
	}
	wc, err := p.wakeR.SyscallConn()
	if err != nil {
		return false
	}
	wake := -1
	wc.Control(func(fd uintptr) { wake = int(fd) }) //nolint:errcheck // wake stays -1
	if wake < 0 {
		return false
	}
	// A splice moves at most what dst has room for: a caller's pipe of
	// the default 64 KiB would cost a wake-up for every 64 KiB. Its
	// size is only grown, which its reader cannot tell but by speed.
	if sz, err := unix.FcntlInt(uintptr(dfd), unix.F_GETPIPE_SZ, 0); err == nil && sz < pipeSize() {
		unix.FcntlInt(uintptr(dfd), unix.F_SETPIPE_SZ, pipeSize()) //nolint:errcheck // a larger pipe is only faster
	}
	handled, broken := true, false
	wait, batchBelow := batchWait(), pipeSize()/4
	var last time.Time
	moved := false
	// Read holds r open until the function returns: Finish's Close
	// waits for it, after waking it.
	src.Read(func(fd uintptr) bool { //nolint:errcheck // a closed r ends the copy
		for {
			n, err := spliceNow(int(fd), dfd)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				if avail, _ := unix.IoctlGetInt(int(fd), unix.TIOCINQ); avail == 0 {
					return false // r is empty: wait for it in Go's poller
				}
				// dst is full.
				if !waitFor(unix.PollFd{Fd: int32(dfd), Events: unix.POLLOUT}, wake) {
					return true
				}
				continue
			case errors.Is(err, unix.EPIPE):
				// The kernel looks for dst's reader before it
				// looks for r's end: with r empty, r has ended
				// (its writers are gone, or the splice would
				// have waited) and nothing was lost.
				if avail, _ := unix.IoctlGetInt(int(fd), unix.TIOCINQ); avail > 0 {
					broken = true
				}
				return true
			case err != nil:
				handled = moved || !errors.Is(err, unix.EINVAL)
				return true
			case n == 0:
				return true // the process's end is closed
			}
			moved = true
			now := time.Now()
			p.lastRead.Store(now.UnixNano())
			// A process that streams in small writes (4 KiB from
			// head or cat) would wake this copy for every one:
			// while it streams, let its writes gather in the pipe
			// first, far from filling it and blocking the process.
			if !p.Interactive && n < batchBelow && now.Sub(last) < streaming {
				time.Sleep(wait)
			}
			last = now
		}
	})
	if broken {
		// The caller's reader is gone. If it read this process's
		// stdout or stderr, the process's next write fails too, as in
		// a pipeline (it may write without end). A write through os,
		// which sees the same, ends this process with SIGPIPE if dst is
		// its stdout or stderr, as a copy would have, unless it handles
		// SIGPIPE.
		if ownStdio(dst) {
			markLost(dst)
			r.Close()
		}
		dst.Write([]byte{0}) //nolint:errcheck // it fails: nothing reads dst
	}
	return handled
}

// spliceNow moves what it can from pipe in to pipe out, up to spliceMax,
// without waiting. It is a raw system call: one that never blocks need
// not tell the Go runtime, which would otherwise hand this thread's
// processor to another thread (waking it) when a large splice takes a
// while.
func spliceNow(in, out int) (int, error) {
	n, _, errno := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, spliceMax, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// waitFor waits in poll(2) until fd is ready as asked, or wake is. It
// reports whether fd is (or has failed: the next call says how).
func waitFor(fd unix.PollFd, wake int) bool {
	for {
		fds := []unix.PollFd{fd, {Fd: int32(wake), Events: unix.POLLIN}}
		_, err := unix.Poll(fds, -1)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil, fds[1].Revents != 0:
			return false
		case fds[0].Revents != 0:
			return true
		}
	}
}
