package runsc

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// WinSize is a terminal's size in character cells.
type WinSize struct {
	Rows, Cols uint16
}

// terminal is the pty of an exec whose process runs on a terminal. sbx
// opens the pty and hands its slave to `runsc exec` as stdio, with runsc
// exec as the leader of the slave's session: runsc passes the slave into
// the sandbox as the process's terminal, and relays the signals the slave
// raises (^C's SIGINT, SIGWINCH on resize) to the terminal's foreground
// process group inside. (runsc's --console-socket is only served by
// `runsc exec --detach`, whose process's exit status sbx could not
// collect; see docs/decisions/0007-exec-pty.md.) sbx's own terminals
// come from the sandbox's devpts instead (0015-sandbox-terminals.md):
// a pod's image has no agent to open one.
type terminal struct {
	master *os.File // for resizing
	io     *os.File // the master, non-blocking, for reads and writes
	slave  *os.File

	outDone chan struct{} // closed when the pty's output has ended
	// resizing runs while sizes are applied: finish waits for it before
	// it closes the master.
	resizing sync.WaitGroup
}

func newTerminal(size WinSize) (*terminal, error) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, err
	}
	t := &terminal{master: master, slave: slave, outDone: make(chan struct{})}
	if size.Rows > 0 && size.Cols > 0 {
		if err := pty.Setsize(master, &pty.Winsize{Rows: size.Rows, Cols: size.Cols}); err != nil {
			t.close()
			return nil, err
		}
	}
	// A pollable copy of the master, so that closing it ends a read
	// blocked on a pty whose other side a background process holds.
	fd, err := unix.Dup(int(master.Fd()))
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		t.close()
		return nil, err
	}
	t.io = os.NewFile(uintptr(fd), "pty-master")
	return t, nil
}

// serve copies stdin into the pty and its output to stdout until the
// output ends, and applies each size from resize. It returns at once;
// finish waits for it.
func (t *terminal) serve(stdin io.Reader, stdout io.Writer, resize <-chan WinSize, done <-chan struct{}) {
	if resize != nil {
		t.resizing.Add(1)
		go func() {
			defer t.resizing.Done()
			for {
				select {
				case ws, ok := <-resize:
					if !ok {
						return
					}
					// The kernel sends SIGWINCH to the slave's
					// foreground process group: runsc exec, which
					// relays it into the sandbox.
					pty.Setsize(t.master, &pty.Winsize{Rows: ws.Rows, Cols: ws.Cols}) //nolint:errcheck // it may have exited
				case <-done:
					return
				}
			}
		}()
	}
	if stdin != nil {
		// Not waited for, as for pipes: a terminal's reader may never
		// return. Its end does not end the pty (a terminal has no EOF).
		go io.Copy(t.io, stdin) //nolint:errcheck // ends when t.io is closed
	}
	if stdout == nil {
		stdout = io.Discard
	}
	go func() {
		defer close(t.outDone)
		// The copy ends with EIO, which is how a pty master reports
		// that every holder of the other side has closed it.
		io.Copy(stdout, t.io) //nolint:errcheck // see above
	}()
}

// finish waits (at most drain) for the pty's output to end once runsc exec
// has exited, then closes the pty.
func (t *terminal) finish(drain time.Duration) {
	select {
	case <-t.outDone:
	case <-time.After(drain):
	}
	t.resizing.Wait() // it returns once done is closed, as it is by now
	t.close()
	<-t.outDone
}

func (t *terminal) close() {
	if t.io != nil {
		t.io.Close()
	}
	t.master.Close()
	t.slave.Close()
}
