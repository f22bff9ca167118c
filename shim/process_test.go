package shim

import (
	"errors"
	"testing"

	"github.com/containerd/errdefs"
)

// Every state against every event: the allowed moves are exactly
// containerd's runc shim's lifecycle; anything else is a badTransition
// (FailedPrecondition) naming the event and the state, and leaves the
// state as it was.
func TestProcessTransitions(t *testing.T) {
	allowed := map[[2]string]procState{
		{"created", "start"}:  stateRunning,
		{"created", "exit"}:   stateStopped,
		{"running", "pause"}:  statePaused,
		{"running", "exit"}:   stateStopped,
		{"paused", "resume"}:  stateRunning,
		{"paused", "exit"}:    stateStopped,
		{"stopped", "delete"}: stateDeleted,
	}
	states := []procState{stateCreated, stateRunning, statePaused, stateStopped, stateDeleted}
	events := []procEvent{evStart, evPause, evResume, evExit, evDelete}
	for _, from := range states {
		for _, ev := range events {
			want, ok := allowed[[2]string{from.String(), string(ev)}]
			got, err := next(from, ev)
			if ok {
				if err != nil || got != want {
					t.Errorf("%s on %s: got %s, %v; want %s", ev, from, got, err, want)
				}
				continue
			}
			var te *badTransition
			if !errors.As(err, &te) || te.From != from || te.Op != string(ev) || !errdefs.IsFailedPrecondition(err) {
				t.Errorf("%s on %s: got %s, %v; want a transition error", ev, from, got, err)
			}
			if got != from {
				t.Errorf("%s on %s moved it to %s", ev, from, got)
			}
		}
	}
}

// An exit is recorded once; a start or pause that arrives after the exit
// does not bring the process back.
func TestProcessExitStands(t *testing.T) {
	p := newProcess("c1", "", stdio{})
	if !p.setExited(0) {
		t.Fatal("exit of a created process not recorded")
	}
	if p.setExited(1) {
		t.Fatal("second exit recorded")
	}
	if code, _ := p.exited(); code != 0 {
		t.Fatalf("exit status %d, want the first one, 0", code)
	}
	if err := p.transition(evStart); err == nil || p.getState() != stateStopped {
		t.Fatalf("start after exit: %v, state %s", err, p.getState())
	}
	if err := p.transition(evPause); err == nil || p.getState() != stateStopped {
		t.Fatalf("pause after exit: %v, state %s", err, p.getState())
	}
	if err := p.transition(evDelete); err != nil || p.getState() != stateDeleted {
		t.Fatalf("delete after exit: %v, state %s", err, p.getState())
	}
	if p.setExited(2) {
		t.Fatal("exit of a deleted process recorded")
	}
}
