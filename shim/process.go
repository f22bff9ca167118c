package shim

import (
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	runsc "sbx.dev/sbx/runsc-sandbox"
)

// procState is a process's place in its lifecycle.
type procState int

const (
	stateCreated procState = iota
	stateRunning
	statePaused
	stateStopped
	stateDeleted
)

func (s procState) String() string {
	return [...]string{"created", "running", "paused", "stopped", "deleted"}[s]
}

func (s procState) proto() task.Status {
	switch s {
	case stateCreated:
		return task.Status_CREATED
	case stateRunning:
		return task.Status_RUNNING
	case statePaused:
		return task.Status_PAUSED
	case stateStopped, stateDeleted:
		return task.Status_STOPPED
	}
	return task.Status_UNKNOWN
}

// transitionError is a request the process's state does not allow.
func transitionError(op string, s procState) error {
	return fmt.Errorf("cannot %s a %s process: %w", op, s, errdefs.ErrFailedPrecondition)
}

// process is a container's init or one exec'd process.
type process struct {
	cid    string // container ID
	execID string // "" for the init
	stdio  stdio
	spec   *specs.Process // exec'd processes only

	// started is closed once the start event is queued, so that the exit
	// event never overtakes it.
	started   chan struct{}
	startOnce sync.Once
	done      chan struct{} // closed once the exit is recorded and published
	doneOnce  sync.Once

	mu         sync.Mutex // guards the fields below
	state      procState
	exiting    bool // the exit is recorded
	pid        int
	exitStatus int
	exitedAt   time.Time
	pio        *pipeIO
	tty        *ttyIO
	exec       *runsc.ExecProcess
}

func newProcess(cid, execID string, s stdio) *process {
	return &process{cid: cid, execID: execID, stdio: s, started: make(chan struct{}), done: make(chan struct{})}
}

func (p *process) markStarted() { p.startOnce.Do(func() { close(p.started) }) }

func (p *process) getState() procState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

func (p *process) getPid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// setExited records the exit once; it reports whether this call did.
// Waiters are released by finish, once the exit event is queued.
func (p *process) setExited(status int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exiting || p.state == stateDeleted {
		return false
	}
	p.exiting = true
	p.state, p.exitStatus, p.exitedAt = stateStopped, status, time.Now()
	return true
}

// finish releases Wait.
func (p *process) finish() { p.doneOnce.Do(func() { close(p.done) }) }

func (p *process) exited() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitStatus, p.exitedAt
}

// drainIO lets the process's output reach containerd, then closes it.
func (p *process) drainIO(d time.Duration) {
	p.mu.Lock()
	pio, tty := p.pio, p.tty
	p.mu.Unlock()
	if pio != nil {
		pio.Drain(d)
	}
	if tty != nil {
		tty.Drain(d)
	}
}

func (p *process) closeIO() {
	p.mu.Lock()
	pio, tty := p.pio, p.tty
	p.mu.Unlock()
	if pio != nil {
		pio.closeProcessEnds()
		pio.Close()
	}
	if tty != nil {
		tty.Close()
	}
}

func (p *process) closeStdin() {
	p.mu.Lock()
	pio, tty := p.pio, p.tty
	p.mu.Unlock()
	if pio != nil {
		pio.CloseStdin()
	}
	if tty != nil {
		tty.CloseStdin()
	}
}
