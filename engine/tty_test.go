package engine

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/wire"
)

// A command on a terminal runs through the agent's pty mode, at the size
// asked for, with TERM=xterm unless the caller set TERM.
func TestPtyProcess(t *testing.T) {
	proc := ptyProcess(specs.Process{Args: []string{"vim", "f"}, Env: []string{"PATH=/bin"}}, WinSize{Rows: 30, Cols: 100})
	want := []string{wire.MountPath, "pty", "--size", "30x100", "--", "vim", "f"}
	if !slices.Equal(proc.Args, want) {
		t.Fatalf("args %q, want %q", proc.Args, want)
	}
	if !slices.Equal(proc.Env, []string{"PATH=/bin", "TERM=xterm"}) {
		t.Fatalf("env %q", proc.Env)
	}
	proc = ptyProcess(specs.Process{Args: []string{"sh"}, Env: []string{"TERM=dumb"}}, WinSize{})
	if want := []string{wire.MountPath, "pty", "--", "sh"}; !slices.Equal(proc.Args, want) {
		t.Fatalf("args without a size %q, want %q", proc.Args, want)
	}
	if !slices.Equal(proc.Env, []string{"TERM=dumb"}) {
		t.Fatalf("a caller's TERM was changed: %q", proc.Env)
	}
}
