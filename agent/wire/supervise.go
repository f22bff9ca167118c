package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// Supervised processes are commands the host starts, over one long-lived
// agent session, as children of the init (see the agent's supervise.go).
// The host speaks to the session ("hutch-init supervise", run as root
// through runsc exec) over a yamux session on its stdin and stdout: every
// request is a stream of its own, made of frames. A frame is a kind byte, a payload
// length (4 bytes, big endian) and the payload.
//
// A stream opens with a FrameRequest carrying a SuperviseRequest as JSON
// and is answered with a FrameReply carrying a SuperviseReply. List and
// signal streams end there. Start and attach streams, when the reply has
// a PID, go on: the session sends the command's output (FrameStdout,
// FrameStderr) and, once it has ended and its output is drained, a
// FrameExit with an ExitInfo; the host may send input (FrameStdin) and
// its end (FrameStdinEOF). A host that closes the stream detaches: the
// command goes on, its output discarded, until someone attaches again.

// Frame kinds.
const (
	FrameRequest  byte = 'q' // host to session: a SuperviseRequest
	FrameReply    byte = 'r' // session to host: a SuperviseReply
	FrameStdout   byte = 'o' // session to host: output
	FrameStderr   byte = 'e' // session to host: output
	FrameExit     byte = 'x' // session to host: an ExitInfo, the last frame
	FrameStdin    byte = 'i' // host to session: input
	FrameStdinEOF byte = 'c' // host to session: end of input
)

// Operations of a SuperviseRequest.
const (
	OpStart  = "start"
	OpAttach = "attach"
	OpSignal = "signal"
	OpList   = "list"
)

// Kinds of failure a SuperviseReply reports besides a command that cannot
// be executed.
const (
	KindNotFound = "not-found" // no such supervised process
	KindDenied   = "denied"    // the process belongs to another user
	KindInvalid  = "invalid"   // the request is malformed
)

// Limits of the protocol.
const (
	// MaxMeta bounds a supervised process's metadata.
	MaxMeta = 16 << 10
	// MaxRequest bounds a request frame (arguments and environment).
	MaxRequest = 1 << 20
	// MaxData is the largest output or input frame.
	MaxData = 32 << 10
	// MaxFinished is how many ended supervised processes the init keeps
	// the exit status of.
	MaxFinished = 256
)

// SuperviseRequest is one request to the supervisor.
type SuperviseRequest struct {
	Op string `json:"op"`

	// Start: the command, its environment, working directory and user.
	// The user is honoured only for a root client; any other client's
	// commands run as the client itself.
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	UID  uint32   `json:"uid,omitempty"`
	GID  uint32   `json:"gid,omitempty"`
	// Check, if set, is the command to look up for the 126/127 statuses
	// when Args[0] is a wrapper that runs it.
	Check string `json:"check,omitempty"`
	// Stdin gives the command a pipe as its input; without it, /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// Timeout, if positive, kills the command after that long.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Meta is the client's own description of the command, kept with it
	// and returned by list (at most MaxMeta bytes).
	Meta []byte `json:"meta,omitempty"`

	// Attach and signal: the process. Signal: the signal number.
	Pid    int `json:"pid,omitempty"`
	Signal int `json:"signal,omitempty"`
}

// SuperviseReply answers a SuperviseRequest.
type SuperviseReply struct {
	// Pid is the started or attached process.
	Pid int `json:"pid,omitempty"`
	// Status is 126 or 127 when the command could not be executed, with
	// Error saying why.
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
	// Kind classifies an Error that is not the command's.
	Kind string `json:"kind,omitempty"`
	// Args are the attached process's arguments.
	Args []string `json:"args,omitempty"`
	// Stdin says that the attached process's input is open.
	Stdin bool `json:"stdin,omitempty"`
	// Procs is the answer to list.
	Procs []SupervisedProc `json:"procs,omitempty"`
}

// SupervisedProc is one process in a list.
type SupervisedProc struct {
	Pid  int      `json:"pid"`
	UID  uint32   `json:"uid"`
	Args []string `json:"args"`
	Meta []byte   `json:"meta,omitempty"`
	// Exit is how it ended; nil while it runs.
	Exit *ExitInfo `json:"exit,omitempty"`
}

// ExitInfo is how a supervised process ended.
type ExitInfo struct {
	// Code is the exit status, when it exited.
	Code int `json:"code"`
	// Signal is the signal that killed it, if one did.
	Signal int `json:"signal,omitempty"`
	// TimedOut says that it was killed for its timeout.
	TimedOut bool `json:"timedOut,omitempty"`
}

// Status is the exit status as a shell reports it: the code, or 128+N
// when signal N killed the process.
func (x ExitInfo) Status() int {
	if x.Signal != 0 {
		return 128 + x.Signal
	}
	return x.Code
}

// ErrFrameTooLarge is the error of a frame longer than its bound.
var ErrFrameTooLarge = errors.New("frame too large")

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	buf := make([]byte, 5+len(payload))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame whose payload is at most max bytes.
func ReadFrame(r io.Reader, max int) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if int64(n) > int64(max) {
		return 0, nil, fmt.Errorf("%w: %d bytes of kind %q", ErrFrameTooLarge, n, hdr[0])
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// SuperviseMuxConfig is the yamux configuration of both ends of a
// supervisor session.
func SuperviseMuxConfig() *yamux.Config {
	c := PortMuxConfig()
	c.AcceptBacklog = 1024
	return c
}
