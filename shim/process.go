package shim

import (
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/runsc"
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
	return &badTransition{Op: op, From: s}
}

// badTransition is a request or event that process state From does not
// allow (starting a running process, pausing a stopped one). It is
// errdefs.ErrFailedPrecondition.
type badTransition struct {
	Op   string
	From procState
}

func (e *badTransition) Error() string {
	return fmt.Sprintf("cannot %s a %s process", e.Op, e.From)
}

func (e *badTransition) Unwrap() error { return errdefs.ErrFailedPrecondition }

// procEvent is what moves a process from one state to the next.
type procEvent string

const (
	evStart  procEvent = "start"  // it runs (started, restored or exec'd)
	evPause  procEvent = "pause"  // its container was frozen
	evResume procEvent = "resume" // and thawed
	evExit   procEvent = "exit"   // its exit is recorded
	evDelete procEvent = "delete" // containerd deleted it
)

// transitions are a process's lifecycle, as in containerd's runc shim
// (process/init_state.go): created -> running <-> paused, any of them ->
// stopped when it exits (a process killed before it started exits too),
// stopped -> deleted. Nothing leaves deleted.
var transitions = map[procState]map[procEvent]procState{
	stateCreated: {evStart: stateRunning, evExit: stateStopped},
	stateRunning: {evPause: statePaused, evExit: stateStopped},
	statePaused:  {evResume: stateRunning, evExit: stateStopped},
	stateStopped: {evDelete: stateDeleted},
	stateDeleted: {},
}

// next is the state ev moves a process in state s to, or a
// *badTransition.
func next(s procState, ev procEvent) (procState, error) {
	to, ok := transitions[s][ev]
	if !ok {
		return s, transitionError(string(ev), s)
	}
	return to, nil
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
	state      procState  // changed by transition only
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

// transition moves the process along ev, or returns a *badTransition
// and leaves it as it is.
func (p *process) transition(ev procEvent) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.transitionLocked(ev)
}

func (p *process) transitionLocked(ev procEvent) error {
	to, err := next(p.state, ev)
	if err != nil {
		return err
	}
	p.state = to
	return nil
}

// setExited records the exit once; it reports whether this call did.
// Waiters are released by finish, once the exit event is queued.
func (p *process) setExited(status int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.transitionLocked(evExit) != nil {
		return false
	}
	p.exitStatus, p.exitedAt = status, time.Now()
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
