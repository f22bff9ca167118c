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

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/runsc"
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
// sandbox). The log survives pause and resume. Only whole lines are
// written while the sandbox runs: the one being written waits for its end.
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
	l := &logLines{f: f, out: req.Out}
	stopped := sb.State == StateStopped
	for {
		if err := l.copy(stopped); err != nil {
			return err
		}
		if !req.Follow || stopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPollInterval):
		}
		cur, err := e.load(sb.ID)
		stopped = err != nil || cur.State == StateStopped
	}
}

// logLines copies a sandbox log to out as the init writes it: whole lines
// (the init writes each in one piece, which a reader may still find half
// written), across the init's cuts (agent's cappedLog: the file emptied,
// then a note and the newest lines written back).
type logLines struct {
	f   *os.File
	out io.Writer
	off int64 // how far f has been read
	// partial is what was read of a line not yet whole.
	partial []byte
	// last is the last line written to out, its newline included.
	last []byte
	// afterCut: a cut was seen and nothing the init wrote back after it
	// has been read yet (the reader found the file emptied, before the
	// write-back): what is read next still starts with lines this reader
	// may have written already.
	afterCut bool
}

// copy writes the whole lines f holds past what has been written, and
// with final the rest as well.
func (l *logLines) copy(final bool) error {
	fi, err := l.f.Stat()
	if err != nil {
		return err
	}
	cut := l.afterCut || l.rewritten(fi.Size())
	if cut && !l.afterCut {
		// The lines read so far are gone from the file; the newest of
		// them are written again after the note.
		l.off, l.partial = 0, nil
	}
	b, err := io.ReadAll(io.NewSectionReader(l.f, l.off, max(fi.Size()-l.off, 0)))
	if err != nil {
		return err
	}
	l.off += int64(len(b))
	b = append(l.partial, b...)
	l.partial = nil
	if !final {
		i := bytes.LastIndexByte(b, '\n')
		b, l.partial = b[:i+1], append([]byte(nil), b[i+1:]...)
	}
	// Until a whole line of the write-back is read, the cut is not over.
	l.afterCut = cut && len(b) == 0
	if cut && l.last != nil {
		// Written back after a cut: what this reader has written
		// already, up to the last line it wrote. Lines lost to the
		// cut before this reader saw them leave it not found: then
		// all is written, the note saying so first.
		if i := lastLine(b, l.last); i >= 0 {
			b = b[i+len(l.last):]
		}
	}
	if len(b) == 0 {
		return nil
	}
	if _, err := l.out.Write(b); err != nil {
		return err
	}
	if b[len(b)-1] == '\n' {
		i := bytes.LastIndexByte(b[:len(b)-1], '\n')
		l.last = append(l.last[:0], b[i+1:]...)
	}
	return nil
}

// rewritten tells whether f, of size size, no longer holds what was read
// last where it was read: the init has cut the log since (and it may have
// grown past where it was read to).
func (l *logLines) rewritten(size int64) bool {
	if size < l.off {
		return true
	}
	n := int64(len(l.last) + len(l.partial))
	if n == 0 || n > l.off {
		return false
	}
	b := make([]byte, n)
	if _, err := l.f.ReadAt(b, l.off-n); err != nil {
		return true
	}
	return !bytes.Equal(b[:len(l.last)], l.last) || !bytes.Equal(b[len(l.last):], l.partial)
}

// lastLine is the offset in b of the last whole line equal to line (its
// newline included), or -1.
func lastLine(b, line []byte) int {
	for end := len(b); end > 0; {
		i := bytes.LastIndex(b[:end], line)
		if i < 0 {
			return -1
		}
		if i == 0 || b[i-1] == '\n' {
			return i
		}
		end = i + len(line) - 1
	}
	return -1
}

// spawn starts proc's command as a child of the sandbox's init, so that it
// survives pause and resume, and writes its PID (inside the sandbox) to
// out. Its output goes to the sandbox's log.
func (e *Engine) spawn(ctx context.Context, sb *record, proc specs.Process, out io.Writer) (int, error) {
	args := proc.Args
	proc.Args = append([]string{wire.MountPath, wire.ModeSpawn, "--"}, args...)
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
	case code == wire.StatusNotFound || code == wire.StatusNotExecutable:
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
