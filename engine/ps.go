package engine

import (
	"context"

	"hutch.dev/hutch/runsc"
)

// Process is a process inside a sandbox. PIDs are the sandbox's own.
type Process = runsc.Process

// Processes lists the processes inside sandbox ref, as `runsc ps` sees
// them: the agent as PID 1, and every exec'd command.
func (e *Engine) Processes(ctx context.Context, ref string) ([]Process, error) {
	sb, err := e.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	return e.runscFor(sb).Ps(ctx, sb.ID)
}
