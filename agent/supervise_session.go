package agent

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
)

func init() { subcommands[wire.ModeSupervise] = superviseMain }

// outputLinger is how long a session keeps reading a process's output
// after it ended, while more comes: what a background child of it writes
// later is not waited for.
const outputLinger = 100 * time.Millisecond

// superviseMain is "supervise": the session agent of supervised
// processes. It serves a yamux session on stdin/stdout, one request per
// stream (see agent/wire/supervise.go), by asking the init over SocketPath.
func superviseMain(args []string) int {
	if len(args) != 0 {
		return usage("supervise")
	}
	return serveSession(stdio{out: wire.CoalesceFrames(os.Stdout)}, wire.SuperviseMuxConfig(), serveSuperviseStream)
}

// frameWriter writes whole frames on a stream from several goroutines.
type frameWriter struct {
	mu sync.Mutex // guards w
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, payload []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return wire.WriteFrame(f.w, kind, payload)
}

func (f *frameWriter) json(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return f.frame(kind, b)
}

func serveSuperviseStream(st net.Conn) {
	defer st.Close()
	w := &frameWriter{w: st}
	kind, payload, err := wire.ReadFrame(st, wire.MaxRequest)
	if err != nil {
		return
	}
	var req wire.SuperviseRequest
	if kind != wire.FrameRequest || json.Unmarshal(payload, &req) != nil {
		w.json(wire.FrameReply, wire.SuperviseReply{Error: "bad request frame", Kind: wire.KindInvalid}) //nolint:errcheck
		return
	}
	nc, err := dialInit(SocketPath, initStartWait)
	if err != nil {
		w.json(wire.FrameReply, wire.SuperviseReply{Error: "cannot reach the sandbox's init: " + err.Error()}) //nolint:errcheck
		return
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	if err := writeMsg(c, req); err != nil {
		w.json(wire.FrameReply, wire.SuperviseReply{Error: "init: " + err.Error()}) //nolint:errcheck
		return
	}
	switch req.Op {
	case wire.OpStart, wire.OpAttach:
		relay(st, w, c)
	default:
		var r wire.SuperviseReply
		fds, err := readMsg(c, nil, &r)
		closeFds(fds)
		if err != nil {
			r = wire.SuperviseReply{Error: "no reply from init: " + err.Error()}
		}
		w.json(wire.FrameReply, r) //nolint:errcheck // the host may be gone
	}
}

// relay serves an attachment: it passes the init's reply on, then the
// process's output to the host and the host's input to the process,
// until the process has ended and its output is drained (a
// wire.FrameExit), or the host detaches, or the init drops the attachment.
func relay(st net.Conn, w *frameWriter, c *net.UnixConn) {
	var m attachMsg
	fds, err := readMsg(c, nil, &m)
	if err != nil {
		closeFds(fds)
		w.json(wire.FrameReply, wire.SuperviseReply{Error: "no reply from init: " + err.Error()}) //nolint:errcheck
		return
	}
	var outs []*os.File
	var stdin *os.File
	next := 0
	take := func(has bool, name string) *os.File {
		if !has || next >= len(fds) {
			return nil
		}
		f := os.NewFile(uintptr(fds[next]), name)
		next++
		return f
	}
	stdout := take(m.Stdout, "stdout")
	stderr := take(m.Stderr, "stderr")
	stdin = take(m.SuperviseReply.Stdin, "stdin")
	closeFds(fds[next:])
	for _, f := range []*os.File{stdout, stderr, stdin} {
		if f != nil {
			defer f.Close()
		}
	}
	if err := w.json(wire.FrameReply, m.SuperviseReply); err != nil || m.SuperviseReply.Pid == 0 {
		return
	}

	var (
		exitMu sync.Mutex // guards exit
		exit   = m.Exit
		ended  atomic.Bool // the process has ended: output lingers
		gone   = make(chan struct{})
		once   sync.Once
	)
	leave := func() { once.Do(func() { close(gone) }) }
	exited := make(chan struct{})
	markExit := func(x *wire.ExitInfo) {
		exitMu.Lock()
		if exit == nil {
			exit = x
		}
		exitMu.Unlock()
		if ended.CompareAndSwap(false, true) {
			for _, f := range outs {
				f.SetReadDeadline(time.Now().Add(outputLinger)) //nolint:errcheck
			}
			close(exited)
		}
	}

	// Output to the host.
	var wg sync.WaitGroup
	for _, o := range []struct {
		f    *os.File
		kind byte
	}{{stdout, wire.FrameStdout}, {stderr, wire.FrameStderr}} {
		if o.f == nil {
			continue
		}
		outs = append(outs, o.f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, wire.MaxData)
			for {
				n, err := o.f.Read(buf)
				if n > 0 {
					if ended.Load() {
						o.f.SetReadDeadline(time.Now().Add(outputLinger)) //nolint:errcheck
					}
					if w.frame(o.kind, buf[:n]) != nil {
						leave()
						return
					}
				}
				if err != nil {
					// The linger ends reading only when nothing is
					// left in the pipe: a reader that ran late must
					// not lose what was written before the exit.
					if errors.Is(err, os.ErrDeadlineExceeded) && pendingBytes(o.f) > 0 {
						o.f.SetReadDeadline(time.Now().Add(outputLinger)) //nolint:errcheck
						continue
					}
					return
				}
			}
		}()
	}
	if exit != nil {
		markExit(exit)
	}

	// Input from the host; its end of the stream detaches.
	go func() {
		defer leave()
		for {
			kind, payload, err := wire.ReadFrame(st, wire.MaxData)
			if err != nil {
				return
			}
			switch kind {
			case wire.FrameStdin:
				if stdin != nil {
					stdin.SetWriteDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck
					stdin.Write(payload)                                     //nolint:errcheck // a process that does not read loses it
				}
			case wire.FrameStdinEOF:
				if stdin != nil {
					stdin.Close()
					stdin = nil
				}
				writeMsg(c, struct {
					Op string `json:"op"`
				}{opCloseStdin}) //nolint:errcheck // the process may be gone
			}
		}
	}()

	// The init's word: the exit, or the end of the attachment.
	go func() {
		for {
			var msg struct {
				Exit *wire.ExitInfo `json:"exit"`
			}
			fds, err := readMsg(c, nil, &msg)
			closeFds(fds)
			if err != nil {
				leave() // replaced by another attachment, or the init is gone
				return
			}
			if msg.Exit != nil {
				markExit(msg.Exit)
			}
		}
	}()

	select {
	case <-exited:
		outputDone := make(chan struct{})
		go func() { wg.Wait(); close(outputDone) }()
		select {
		case <-outputDone:
			exitMu.Lock()
			x := *exit
			exitMu.Unlock()
			w.json(wire.FrameExit, x) //nolint:errcheck // the host may be gone
		case <-gone:
		}
	case <-gone:
	}
	// Stop the output readers before the init drains again.
	for _, f := range outs {
		f.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck
	}
	wg.Wait()
}

// pendingBytes is how much output waits in pipe f.
func pendingBytes(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) { //nolint:errcheck // a closed pipe has nothing pending
		n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
	})
	return n
}
