package serve

import (
	"errors"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/envdpb/processpb"
)

// endEvent describes how a command ended, as envd does from Go's
// os.ProcessState: a command killed by a signal (sent through SendSignal,
// or by its timeout) did not exit and has exit code -1.
func endEvent(code int, err error, sent syscall.Signal) *processpb.ProcessEvent_EndEvent {
	signaled := syscall.Signal(0)
	switch {
	case errors.Is(err, engine.ErrTimeout):
		signaled = syscall.SIGKILL
	case err == nil && sent != 0 && code == 128+int(sent):
		signaled = sent
	}
	if signaled != 0 {
		status := "signal: " + signaled.String()
		return &processpb.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	if code < 0 {
		msg := "hutch could not run the command"
		if err != nil {
			msg = err.Error()
		}
		return &processpb.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: "unknown", Error: &msg}
	}
	ev := &processpb.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
	switch {
	case err != nil:
		msg := err.Error()
		ev.Error = &msg
	case code != 0:
		ev.Error = &ev.Status
	}
	return ev
}

// outKind is the stream a command's output came on.
type outKind int

const (
	outStdout outKind = iota
	outStderr
	outPty
)

func dataEvent(kind outKind, b []byte) *processpb.ProcessEvent {
	d := &processpb.ProcessEvent_DataEvent{}
	switch kind {
	case outStdout:
		d.Output = &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}
	case outStderr:
		d.Output = &processpb.ProcessEvent_DataEvent_Stderr{Stderr: b}
	case outPty:
		d.Output = &processpb.ProcessEvent_DataEvent_Pty{Pty: b}
	}
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}
}

// hubWriter publishes what a command writes on one of its outputs. It
// never fails: output nobody follows is dropped.
type hubWriter struct {
	h    *hub
	kind outKind
}

func (w hubWriter) Write(b []byte) (int, error) {
	w.h.publish(dataEvent(w.kind, append([]byte(nil), b...)))
	return len(b), nil
}

var _ io.Writer = hubWriter{}

// hub fans a command's events out to the streams that follow it.
type hub struct {
	grace time.Duration

	// pubMu serializes publishing: events reach every subscriber in one
	// order, and the end event last.
	pubMu sync.Mutex

	// mu guards subs, ended and detached.
	mu       sync.Mutex
	subs     map[*subscriber]struct{}
	ended    *processpb.ProcessEvent
	detached bool // the command went on without the service
}

// subscriber is one stream following a command.
type subscriber struct {
	// events carries the command's events, the end event last. It is
	// closed after the end event, or without it when the subscriber
	// fell behind and was cut off.
	events chan *processpb.ProcessEvent
	// gone is closed when the stream leaves.
	gone     chan struct{}
	goneOnce sync.Once
}

func newHub(grace time.Duration) *hub {
	return &hub{grace: grace, subs: map[*subscriber]struct{}{}}
}

// subscribe follows the command's events from now on. A command that has
// ended gives its end event at once.
func (h *hub) subscribe() *subscriber {
	sub := &subscriber{events: make(chan *processpb.ProcessEvent, subscriberBuffer), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended != nil {
		sub.events <- h.ended
		close(sub.events)
		return sub
	}
	if h.detached {
		close(sub.events)
		return sub
	}
	h.subs[sub] = struct{}{}
	return sub
}

// unsubscribe stops following: the stream left.
func (h *hub) unsubscribe(sub *subscriber) {
	sub.goneOnce.Do(func() { close(sub.gone) })
	h.mu.Lock()
	delete(h.subs, sub)
	h.mu.Unlock()
}

// publish delivers ev to every subscriber, waiting up to the grace for
// one that is full before cutting it off. Without subscribers, or after
// the end, ev is dropped.
func (h *hub) publish(ev *processpb.ProcessEvent) {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	if h.ended != nil || h.detached {
		h.mu.Unlock()
		return
	}
	subs := slices.Collect(maps.Keys(h.subs))
	h.mu.Unlock()
	for _, sub := range subs {
		if !h.deliver(sub, ev) {
			h.mu.Lock()
			_, still := h.subs[sub]
			delete(h.subs, sub)
			h.mu.Unlock()
			if still {
				close(sub.events)
			}
		}
	}
}

// finish delivers the end event to every subscriber and closes their
// channels; later subscribers get it at once.
func (h *hub) finish(end *processpb.ProcessEvent) {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	h.ended = end
	subs := slices.Collect(maps.Keys(h.subs))
	clear(h.subs)
	h.mu.Unlock()
	for _, sub := range subs {
		h.deliver(sub, end)
		close(sub.events)
	}
}

// detach closes every subscriber's channel without an end event: the
// service no longer follows the command. Later subscribers get a closed
// channel at once.
func (h *hub) detach() {
	h.pubMu.Lock()
	defer h.pubMu.Unlock()
	h.mu.Lock()
	h.detached = true
	subs := slices.Collect(maps.Keys(h.subs))
	clear(h.subs)
	h.mu.Unlock()
	for _, sub := range subs {
		close(sub.events)
	}
}

func (h *hub) isDetached() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.detached
}

// deliver sends ev to sub, waiting up to the grace while sub is full. It
// reports false if sub stayed full; a subscriber that left takes nothing
// more and is not waited for.
func (h *hub) deliver(sub *subscriber, ev *processpb.ProcessEvent) bool {
	select {
	case sub.events <- ev:
		return true
	case <-sub.gone:
		return true
	default:
	}
	t := time.NewTimer(h.grace)
	defer t.Stop()
	select {
	case sub.events <- ev:
		return true
	case <-sub.gone:
		return true
	case <-t.C:
		return false
	}
}
