package serve

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
)

func (s *Server) sandboxMetrics(r *http.Request, tenantName string) (int, any, error) {
	if err := checkQuery(r, "start", "end"); err != nil {
		return 0, nil, err
	}
	var start, end time.Time
	for _, f := range []struct {
		name string
		t    *time.Time
	}{{"start", &start}, {"end", &end}} {
		v := r.URL.Query().Get(f.name)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil || sec < 0 {
			return 0, nil, fmt.Errorf("%s %q: want a Unix time in seconds: %w", f.name, v, errdefs.ErrInvalidArgument)
		}
		*f.t = time.Unix(sec, 0)
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return 0, nil, fmt.Errorf("end %d is before start %d: %w", end.Unix(), start.Unix(), errdefs.ErrInvalidArgument)
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	if sb.State == engine.StateRunning && time.Since(s.history.last(sb.ID)) >= historyMinGap {
		if err := s.sampleOne(r.Context(), sb); err != nil {
			return 0, nil, err
		}
	}
	return http.StatusOK, s.history.window(sb.ID, start, end), nil
}

// Bounds of one answer of the logs calls: the log itself is under 8 MiB
// (the init's cap), of which an answer holds at most maxLogBytes of lines,
// each cut at maxLogLine. A client pages on with start (v1) or cursor
// (v2): the timestamp, in milliseconds, after its last line's.
const (
	maxLogBytes = 1 << 20
	maxLogLine  = 16 << 10
)

// sandboxLogs is GET /sandboxes/{id}/logs and /v2/...: without start or
// cursor, the last limit lines; with one, the first limit lines from it
// on (direction forward, the default) or the last limit lines before it
// (backward), oldest first, within maxLogBytes.
func (s *Server) sandboxLogs(r *http.Request, tenantName string) (int, any, error) {
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	pg := &logPage{limit: 1000}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return 0, nil, fmt.Errorf("limit %q: want 1 to 10000: %w", v, errdefs.ErrInvalidArgument)
		}
		pg.limit = n
	}
	for _, name := range []string{"start", "cursor"} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return 0, nil, fmt.Errorf("%s %q: want a time in milliseconds since 1970: %w", name, v, errdefs.ErrInvalidArgument)
		}
		c := time.UnixMilli(ms)
		pg.cursor = &c
	}
	switch d := q.Get("direction"); d {
	case "", "forward":
	case "backward":
		pg.backward = true
	default:
		return 0, nil, fmt.Errorf("direction %q: want forward or backward: %w", d, errdefs.ErrInvalidArgument)
	}
	// Without a cursor, the newest lines.
	pg.tail = pg.cursor == nil || pg.backward
	done, err := s.logReads.take(tenantName)
	if err != nil {
		return 0, nil, err
	}
	err = s.place.Logs(r.Context(), sb.ID, pg)
	done()
	if err != nil && !errors.Is(err, errPageFull) {
		return 0, nil, err
	}
	pg.flush()
	type logLine struct {
		Timestamp time.Time `json:"timestamp"`
		Line      string    `json:"line"`
	}
	logs := []logLine{}
	for _, l := range pg.lines {
		logs = append(logs, logLine{Timestamp: l.t, Line: l.text})
	}
	return http.StatusOK, map[string]any{"logs": logs, "logEntries": []any{}}, nil
}

// maxLogReads bounds one tenant's log reads in flight: each reads the
// whole log (up to 8 MiB) to find its page.
const maxLogReads = 2

// inFlight counts each tenant's calls of one kind in flight, up to max.
type inFlight struct {
	what string
	max  int

	// mu guards n.
	mu sync.Mutex
	n  map[string]int
}

// take counts one more call of tenant, unless it has max in flight
// (ErrResourceExhausted); done uncounts it.
func (f *inFlight) take(tenantName string) (done func(), err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[string]int{}
	}
	if f.n[tenantName] >= f.max {
		return nil, fmt.Errorf("the tenant has %d %s in flight, the most it may: wait for one to end: %w", f.n[tenantName], f.what, errdefs.ErrResourceExhausted)
	}
	f.n[tenantName]++
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.n[tenantName]--; f.n[tenantName] <= 0 {
			delete(f.n, tenantName)
		}
	}, nil
}

// errPageFull ends the reading of a log whose page is complete.
var errPageFull = errors.New("log page complete")

// logPage takes a log, lines "TIMESTAMP TEXT", and keeps one page of it:
// with tail, the last limit lines (before cursor, if set); else the first
// limit lines from cursor on. It holds at most maxLogBytes of lines, each
// cut at maxLogLine, however long the log.
type logPage struct {
	limit    int
	cursor   *time.Time
	backward bool
	tail     bool

	lines []logEntry
	bytes int
	// partial is the line being written, cut at maxLogLine.
	partial []byte
	cut     bool
}

type logEntry struct {
	t    time.Time
	text string
}

func (p *logPage) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		chunk := b
		if i >= 0 {
			chunk = b[:i]
		}
		if room := maxLogLine - len(p.partial); room > 0 {
			p.partial = append(p.partial, chunk[:min(room, len(chunk))]...)
		}
		if i < 0 {
			break
		}
		b = b[i+1:]
		if full := p.line(); full {
			return n, errPageFull
		}
	}
	return n, nil
}

// flush takes a last line without its newline.
func (p *logPage) flush() {
	if len(p.partial) > 0 {
		p.line()
	}
}

// line takes the line in partial; full says the page needs no more.
func (p *logPage) line() (full bool) {
	l := string(p.partial)
	p.partial = p.partial[:0]
	if l == "" {
		return false
	}
	ts, rest, _ := strings.Cut(l, " ")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		t, rest = time.Time{}, l
	}
	if p.cursor != nil {
		if p.backward && !t.Before(*p.cursor) {
			return true
		}
		if !p.backward && t.Before(*p.cursor) {
			return false
		}
	}
	if !p.tail && (len(p.lines) >= p.limit || p.bytes+len(rest) > maxLogBytes) {
		return true
	}
	p.lines = append(p.lines, logEntry{t: t, text: rest})
	p.bytes += len(rest)
	for p.tail && (len(p.lines) > p.limit || p.bytes > maxLogBytes) {
		p.bytes -= len(p.lines[0].text)
		p.lines = p.lines[1:]
	}
	return false
}
