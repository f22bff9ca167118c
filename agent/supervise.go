package agent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"hutch.dev/hutch/agent/wire"
)

// The init's side of supervised processes. A client (the session agent,
// or any process of the sandbox) sends a wire.SuperviseRequest over
// SocketPath as a message: a length (4 bytes, big endian) and JSON; the
// first byte is thus 0, which tells it from a spawn request ('{'). Creds come from
// SO_PEERCRED as for spawn: only a root client may name another user, or
// act on another user's process.
//
// For start, the init makes pipes, forks the command as its own child in
// a session of its own, keeps the pipes' parent ends and answers with
// duplicates of them (SCM_RIGHTS). The connection then stays open: it is
// the client's attachment. While it is open the client reads the output
// itself, and the init sends it a wire.ExitInfo message when the command
// ends; the client may send {"op":"close-stdin"}. When it closes (the
// client went away, as a `runsc exec` process does on restore), the init
// reads and discards the output so that the command never blocks on a
// full pipe, and keeps its input open. Attach makes a new attachment to
// a running process (the last attachment wins). The init keeps the exit
// status of the last wire.MaxFinished ended processes.

// opCloseStdin is the one message a client sends on an attachment.
const opCloseStdin = "close-stdin"

// superChild is one supervised process.
type superChild struct {
	pid  int
	uid  uint32
	args []string
	meta []byte

	// mu guards everything below; cond signals changes of att and
	// reading.
	mu   sync.Mutex
	cond *sync.Cond
	// out are the read ends of stdout and stderr, nil once drained to
	// their end; outFd their descriptors.
	out   [2]*os.File
	outFd [2]int
	// in is the write end of stdin; nil if the process has none or it
	// was closed.
	in   *os.File
	inFd int
	// att is the client attached, if any.
	att *net.UnixConn
	// reading counts drainers inside a read.
	reading  int
	exit     *wire.ExitInfo
	timer    *time.Timer
	timedOut bool
}

// starting stands for the client of a process being started until
// attach puts the client's connection in its place.
var starting = new(net.UnixConn)

// supervised is the init's table of supervised processes.
var supervised struct {
	mu       sync.Mutex // guards running and finished
	running  map[int]*superChild
	finished []*superChild // oldest first, at most wire.MaxFinished
}

// writeMsg sends v as one message, with fds if any.
func writeMsg(c *net.UnixConn, v any, fds ...int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(buf, oob, nil)
	if err == nil && n < len(buf) {
		_, err = c.Write(buf[n:])
	}
	return err
}

// readMsg reads one message into v, and the descriptors sent with it.
// have is what of it was read already.
func readMsg(c *net.UnixConn, have []byte, v any) ([]int, error) {
	hdr := make([]byte, 4)
	n := copy(hdr, have)
	var fds []int
	if n < 4 {
		oob := make([]byte, unix.CmsgSpace(8*4))
		m, oobn, _, _, err := c.ReadMsgUnix(hdr[n:], oob)
		if oobn > 0 {
			if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
				for _, msg := range msgs {
					if got, err := unix.ParseUnixRights(&msg); err == nil {
						fds = append(fds, got...)
					}
				}
			}
		}
		if err != nil {
			closeFds(fds)
			return nil, err
		}
		if m == 0 {
			closeFds(fds)
			return nil, io.EOF
		}
		if _, err := io.ReadFull(c, hdr[n+m:]); err != nil {
			closeFds(fds)
			return nil, err
		}
	}
	size := binary.BigEndian.Uint32(hdr)
	if size > wire.MaxRequest {
		closeFds(fds)
		return nil, wire.ErrFrameTooLarge
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c, body); err != nil {
		closeFds(fds)
		return nil, err
	}
	if err := json.Unmarshal(body, v); err != nil {
		closeFds(fds)
		return nil, err
	}
	return fds, nil
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// handleSupervise serves one supervise request whose first bytes are
// first. For start and attach it keeps c as the attachment.
func handleSupervise(c *net.UnixConn, first []byte, cred *unix.Ucred) {
	var req wire.SuperviseRequest
	if _, err := readMsg(c, first, &req); err != nil {
		writeMsg(c, wire.SuperviseReply{Error: "bad supervise request: " + err.Error(), Kind: wire.KindInvalid}) //nolint:errcheck
		c.Close()
		return
	}
	switch req.Op {
	case wire.OpStart:
		superStart(c, req, cred)
	case wire.OpAttach:
		superAttach(c, req, cred)
	case wire.OpSignal:
		writeMsg(c, superSignal(req, cred)) //nolint:errcheck // the client may be gone
		c.Close()
	case wire.OpList:
		writeMsg(c, superList(cred)) //nolint:errcheck // the client may be gone
		c.Close()
	default:
		writeMsg(c, wire.SuperviseReply{Error: fmt.Sprintf("unknown operation %q", req.Op), Kind: wire.KindInvalid}) //nolint:errcheck
		c.Close()
	}
}

// superStart starts req and attaches c to it.
func superStart(c *net.UnixConn, req wire.SuperviseRequest, cred *unix.Ucred) {
	fail := func(r wire.SuperviseReply) {
		writeMsg(c, attachMsg{SuperviseReply: r}) //nolint:errcheck // the client may be gone
		c.Close()
	}
	if len(req.Args) == 0 {
		fail(wire.SuperviseReply{Error: "start: no command given", Kind: wire.KindInvalid})
		return
	}
	if len(req.Meta) > wire.MaxMeta {
		fail(wire.SuperviseReply{Error: fmt.Sprintf("start: metadata of %d bytes, at most %d allowed", len(req.Meta), wire.MaxMeta), Kind: wire.KindInvalid})
		return
	}
	uid, gid := req.UID, req.GID
	if cred.Uid != 0 {
		// Never more than the client itself.
		uid, gid = cred.Uid, cred.Gid
	}
	if req.Check != "" {
		if _, st, err := resolve(req.Check, req.Env, req.Dir); err != nil {
			fail(wire.SuperviseReply{Status: st, Error: err.Error()})
			return
		}
	}
	path, st, err := resolve(req.Args[0], req.Env, req.Dir)
	if err != nil {
		fail(wire.SuperviseReply{Status: st, Error: err.Error()})
		return
	}
	k, err := forkSupervised(path, req, uid, gid)
	if err != nil {
		st := wire.StatusNotExecutable
		if errors.Is(err, syscall.ENOENT) {
			st = wire.StatusNotFound
		}
		fail(wire.SuperviseReply{Status: st, Error: fmt.Sprintf("%s: %v", req.Args[0], err)})
		return
	}
	logLine("init", fmt.Sprintf("started %d (supervised): %s", k.pid, req.Args[0]))
	k.attach(c, wire.SuperviseReply{Pid: k.pid, Args: k.args})
}

// forkSupervised forks path as a child of the init with pipes for its
// standard streams, and registers it.
func forkSupervised(path string, req wire.SuperviseRequest, uid, gid uint32) (*superChild, error) {
	var child [3]int // the child's stdin, stdout, stderr
	var parent [3]int
	for i := range parent {
		child[i], parent[i] = -1, -1
	}
	defer func() { closeFds(child[:]) }()
	cleanup := true
	defer func() {
		if cleanup {
			closeFds(parent[:])
		}
	}()
	if req.Stdin {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, err
		}
		child[0], parent[0] = p[0], p[1]
	} else {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		child[0] = fd
	}
	for i := 1; i <= 2; i++ {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, err
		}
		child[i], parent[i] = p[1], p[0]
	}
	// Only the parent ends are polled: the child gets blocking pipes.
	for _, fd := range parent {
		if fd >= 0 {
			if err := unix.SetNonblock(fd, true); err != nil {
				return nil, err
			}
		}
	}
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: []uintptr{uintptr(child[0]), uintptr(child[1]), uintptr(child[2])},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Credential: &syscall.Credential{Uid: uid, Gid: gid, NoSetGroups: uid == 0},
		},
	}
	k := &superChild{uid: uid, args: req.Args, meta: req.Meta, inFd: -1}
	k.cond = sync.NewCond(&k.mu)
	children.mu.Lock()
	pid, err := syscall.ForkExec(path, req.Args, attr)
	if err == nil {
		k.pid = pid
		supervised.mu.Lock()
		supervised.running[pid] = k
		supervised.mu.Unlock()
	}
	children.mu.Unlock()
	if err != nil {
		return nil, err
	}
	cleanup = false
	if parent[0] >= 0 {
		k.in, k.inFd = os.NewFile(uintptr(parent[0]), "stdin"), parent[0]
	}
	for i := 0; i < 2; i++ {
		k.out[i], k.outFd[i] = os.NewFile(uintptr(parent[i+1]), "output"), parent[i+1]
	}
	// Attached from the start: the drainers wait.
	k.mu.Lock()
	k.att = starting
	if req.Timeout > 0 {
		k.timer = time.AfterFunc(req.Timeout, k.timeout)
	}
	k.mu.Unlock()
	for i := 0; i < 2; i++ {
		go k.drain(i)
	}
	return k, nil
}

// timeout kills the process for its timeout.
func (k *superChild) timeout() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.exit == nil {
		k.timedOut = true
		syscall.Kill(k.pid, syscall.SIGKILL) //nolint:errcheck // not reaped yet: the PID is still its
	}
}

// drain reads and discards output i while no client is attached, until
// its end.
func (k *superChild) drain(i int) {
	buf := make([]byte, 32<<10)
	k.mu.Lock()
	f := k.out[i]
	for {
		for k.att != nil {
			k.cond.Wait()
		}
		k.reading++
		k.mu.Unlock()
		_, err := f.Read(buf)
		k.mu.Lock()
		k.reading--
		k.cond.Broadcast()
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			k.out[i], k.outFd[i] = nil, -1
			k.mu.Unlock()
			f.Close()
			return
		}
	}
}

// attach makes c the process's attachment, replacing any other, and
// sends it r with the parent ends of the pipes still open. It then
// serves c until it closes.
func (k *superChild) attach(c *net.UnixConn, r wire.SuperviseReply) {
	k.mu.Lock()
	old := k.att
	k.att = c
	// Stop the drainers: their reads end at once, and they wait while
	// c is attached.
	for _, f := range k.out {
		if f != nil {
			f.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck // a pipe takes deadlines
		}
	}
	for k.reading > 0 {
		k.cond.Wait()
	}
	for _, f := range k.out {
		if f != nil {
			f.SetReadDeadline(time.Time{}) //nolint:errcheck // a pipe takes deadlines
		}
	}
	// The descriptors, in order: stdout, stderr, stdin; r says which.
	var fds []int
	var has struct{ out, err, in bool }
	if k.out[0] != nil {
		fds, has.out = append(fds, k.outFd[0]), true
	}
	if k.out[1] != nil {
		fds, has.err = append(fds, k.outFd[1]), true
	}
	if k.in != nil {
		fds, has.in = append(fds, k.inFd), true
	}
	r.Stdin = has.in
	msg := attachMsg{SuperviseReply: r, Stdout: has.out, Stderr: has.err, Exit: k.exit}
	err := writeMsg(c, msg, fds...)
	k.mu.Unlock()
	if old != nil && old != c && old != starting {
		old.Close()
	}
	if err != nil {
		k.detach(c)
		return
	}
	c.SetDeadline(time.Time{}) //nolint:errcheck // an attachment lasts
	go k.serveAttachment(c)
}

// attachMsg is the init's answer to start and attach: the reply, which
// of the descriptors follow, and the exit if the process has ended.
type attachMsg struct {
	wire.SuperviseReply
	Stdout bool           `json:"stdout,omitempty"`
	Stderr bool           `json:"stderr,omitempty"`
	Exit   *wire.ExitInfo `json:"exit,omitempty"`
}

// serveAttachment takes close-stdin messages on c until it closes, then
// detaches it.
func (k *superChild) serveAttachment(c *net.UnixConn) {
	defer k.detach(c)
	for {
		var m struct {
			Op string `json:"op"`
		}
		fds, err := readMsg(c, nil, &m)
		closeFds(fds)
		if err != nil {
			return
		}
		if m.Op == opCloseStdin {
			k.mu.Lock()
			if k.in != nil {
				k.in.Close()
				k.in, k.inFd = nil, -1
			}
			k.mu.Unlock()
		}
	}
}

// detach ends attachment c, if it is still the process's, and resumes
// draining.
func (k *superChild) detach(c *net.UnixConn) {
	c.Close()
	k.mu.Lock()
	if k.att == c {
		k.att = nil
		k.cond.Broadcast()
	}
	k.mu.Unlock()
}

// superAttach attaches c to a process.
func superAttach(c *net.UnixConn, req wire.SuperviseRequest, cred *unix.Ucred) {
	k, r := findSupervised(req.Pid, cred)
	if k == nil {
		writeMsg(c, attachMsg{SuperviseReply: r}) //nolint:errcheck // the client may be gone
		c.Close()
		return
	}
	k.attach(c, wire.SuperviseReply{Pid: k.pid, Args: k.args})
}

// findSupervised finds process pid for a client with cred: a running one
// first, else the last that ended.
func findSupervised(pid int, cred *unix.Ucred) (*superChild, wire.SuperviseReply) {
	supervised.mu.Lock()
	k := supervised.running[pid]
	if k == nil {
		for i := len(supervised.finished) - 1; i >= 0; i-- {
			if supervised.finished[i].pid == pid {
				k = supervised.finished[i]
				break
			}
		}
	}
	supervised.mu.Unlock()
	switch {
	case k == nil:
		return nil, wire.SuperviseReply{Error: fmt.Sprintf("no supervised process %d", pid), Kind: wire.KindNotFound}
	case cred.Uid != 0 && cred.Uid != k.uid:
		return nil, wire.SuperviseReply{Error: fmt.Sprintf("process %d belongs to another user", pid), Kind: wire.KindDenied}
	}
	return k, wire.SuperviseReply{}
}

func superSignal(req wire.SuperviseRequest, cred *unix.Ucred) wire.SuperviseReply {
	if req.Signal <= 0 || req.Signal >= 65 {
		return wire.SuperviseReply{Error: fmt.Sprintf("signal %d: no such signal", req.Signal), Kind: wire.KindInvalid}
	}
	k, r := findSupervised(req.Pid, cred)
	if k == nil {
		return r
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.exit != nil {
		return wire.SuperviseReply{Error: fmt.Sprintf("process %d has exited", req.Pid), Kind: wire.KindNotFound}
	}
	// Not reaped yet (reaping sets exit under mu): the PID is still its.
	if err := syscall.Kill(k.pid, syscall.Signal(req.Signal)); err != nil {
		return wire.SuperviseReply{Error: fmt.Sprintf("signal process %d: %v", req.Pid, err), Kind: wire.KindNotFound}
	}
	return wire.SuperviseReply{Pid: k.pid}
}

// superList lists the processes a client with cred may see: its own, or
// all for root.
func superList(cred *unix.Ucred) wire.SuperviseReply {
	supervised.mu.Lock()
	all := make([]*superChild, 0, len(supervised.running)+len(supervised.finished))
	for _, k := range supervised.running {
		all = append(all, k)
	}
	all = append(all, supervised.finished...)
	supervised.mu.Unlock()
	r := wire.SuperviseReply{Procs: []wire.SupervisedProc{}}
	for _, k := range all {
		if cred.Uid != 0 && cred.Uid != k.uid {
			continue
		}
		k.mu.Lock()
		r.Procs = append(r.Procs, wire.SupervisedProc{Pid: k.pid, UID: k.uid, Args: k.args, Meta: k.meta, Exit: k.exit})
		k.mu.Unlock()
	}
	return r
}

// supervisedExited records the end of a supervised process, tells its
// client if one is attached, and reports whether pid was one. The init
// calls it for every child it reaps.
func supervisedExited(pid int, ws syscall.WaitStatus) bool {
	supervised.mu.Lock()
	k := supervised.running[pid]
	if k != nil {
		delete(supervised.running, pid)
		supervised.finished = append(supervised.finished, k)
		if len(supervised.finished) > wire.MaxFinished {
			supervised.finished = supervised.finished[len(supervised.finished)-wire.MaxFinished:]
		}
	}
	supervised.mu.Unlock()
	if k == nil {
		return false
	}
	x := &wire.ExitInfo{Code: ws.ExitStatus()}
	if ws.Signaled() {
		x = &wire.ExitInfo{Code: -1, Signal: int(ws.Signal())}
	}
	k.mu.Lock()
	x.TimedOut = k.timedOut
	k.exit = x
	if k.timer != nil {
		k.timer.Stop()
	}
	if k.in != nil {
		k.in.Close()
		k.in, k.inFd = nil, -1
	}
	att := k.att
	k.mu.Unlock()
	if x.Signal != 0 {
		logLine("init", fmt.Sprintf("%d exited: killed by signal %d", pid, x.Signal))
	} else {
		logLine("init", fmt.Sprintf("%d exited with status %d", pid, x.Code))
	}
	if att != nil && att != starting {
		go func() {
			att.SetWriteDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
			writeMsg(att, struct {
				Exit *wire.ExitInfo `json:"exit"`
			}{x}) //nolint:errcheck // a client that went away detached
		}()
	}
	return true
}
