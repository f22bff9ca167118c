package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	runsc "sbx.dev/sbx/runsc-sandbox"
	"sbx.dev/sbx/runsc-sandbox/agent"
)

// LogsRequest says what Logs writes where.
type LogsRequest struct {
	// Out receives the log.
	Out io.Writer
	// Follow keeps writing new lines until ctx ends or the sandbox is
	// stopped or removed.
	Follow bool
}

// logPollInterval is how often Logs looks for new lines when following.
const logPollInterval = 100 * time.Millisecond

// Logs writes sandbox ref's log: the output of its init and of the
// background processes started with ExecRequest.Detach, one line each,
// prefixed by a UTC timestamp and the source (init or a PID inside the
// sandbox). The log survives pause and resume.
func (e *Engine) Logs(ctx context.Context, ref string, req LogsRequest) error {
	sb, err := e.get(ctx, ref)
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(e.sandboxDir(sb.ID), "init.log"))
	if err != nil {
		return fmt.Errorf("log of sandbox %s: %w", sb.ShortID(), err)
	}
	defer f.Close()
	for {
		if _, err := io.Copy(req.Out, f); err != nil {
			return err
		}
		if !req.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPollInterval):
		}
		cur, err := e.load(sb.ID)
		if err != nil || cur.State == StateStopped {
			_, err := io.Copy(req.Out, f)
			return err
		}
	}
}

// spawn starts proc's command as a child of the sandbox's init, so that it
// survives pause and resume, and writes its PID (inside the sandbox) to
// out. Its output goes to the sandbox's log.
func (e *Engine) spawn(ctx context.Context, sb *record, proc specs.Process, out io.Writer) (int, error) {
	args := proc.Args
	proc.Args = append([]string{agent.MountPath, "spawn", "--"}, args...)
	var stdout, stderr bytes.Buffer
	p, err := e.runscFor(sb).Exec(ctx, sb.ID, proc, runsc.ExecOpts{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return -1, err
	}
	code, err := p.Wait()
	switch {
	case errors.Is(err, runsc.ErrNotStarted):
		// The working directory or user is unusable.
		return ExitNotExecutable, fmt.Errorf("%s: %s", args[0], strings.TrimSpace(stderr.String()))
	case err != nil:
		return -1, err
	case code == agent.StatusNotFound || code == agent.StatusNotExecutable:
		return code, fmt.Errorf("%s", strings.TrimSpace(stderr.String()))
	case code != 0:
		return -1, fmt.Errorf("start %s in the background: %s: %w", args[0], strings.TrimSpace(stderr.String()), errdefs.ErrUnavailable)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(stdout.String()))
	if err != nil {
		return -1, fmt.Errorf("start %s in the background: bad reply %q", args[0], stdout.String())
	}
	if out != nil {
		fmt.Fprintln(out, pid)
	}
	return 0, nil
}
