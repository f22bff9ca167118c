package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"
)

// auditEntry is one line of the audit log: a mutating call, who made it,
// on what, and how it ended.
type auditEntry struct {
	Time time.Time `json:"time"`
	// Tenant is the caller's tenant; empty if it did not authenticate.
	Tenant string `json:"tenant"`
	// Call is the method and path, e.g. "POST /sandboxes".
	Call string `json:"call"`
	// Sandbox is the sandbox the call was on or created, if any.
	Sandbox string `json:"sandbox,omitempty"`
	// Status is the HTTP status of the answer.
	Status int `json:"status"`
	// Result is "ok" or the error message the caller got.
	Result string `json:"result"`
	// Remote is the caller's address.
	Remote string `json:"remote,omitempty"`
	// Truncated says a field was cut to its bound (auditBounds), its
	// end replaced by "...(N bytes more)".
	Truncated bool `json:"truncated,omitempty"`
}

// What a line may hold of each field, in bytes: a caller chooses its
// path, and error messages may quote what it sent. A call that did not
// authenticate gets the tighter bounds, so that whoever reaches the
// server adds at most a few hundred bytes a request.
var (
	auditBounds   = auditLimits{call: 512, sandbox: 64, result: 1024, remote: 64}
	refusedBounds = auditLimits{call: 80, sandbox: 0, result: 120, remote: 64}
)

type auditLimits struct{ call, sandbox, result, remote int }

// bound cuts e's fields to lim, marking e truncated if it cut any.
func (e *auditEntry) bound(lim auditLimits) {
	for _, f := range []struct {
		s *string
		n int
	}{{&e.Call, lim.call}, {&e.Sandbox, lim.sandbox}, {&e.Result, lim.result}, {&e.Remote, lim.remote}} {
		if len(*f.s) > f.n {
			*f.s = clip(*f.s, f.n)
			e.Truncated = true
		}
	}
}

// Defaults of the audit log's rotation.
const (
	defaultAuditMaxBytes = 100 << 20
	defaultAuditKeep     = 5
)

// auditLog appends entries to a file as JSON lines, one write per line, so
// lines from concurrent calls never interleave and other writers appending
// to the same file (O_APPEND) do not either. When a line would take the
// file past maxBytes, it is rotated first: FILE.1 becomes FILE.2 and so
// on, up to FILE.keep (older ones are removed), FILE becomes FILE.1 and a
// new FILE is started. A log opened with no path records nothing. It is
// safe for concurrent use.
type auditLog struct {
	path     string
	maxBytes int64
	keep     int

	// mu guards f, nil once closed or when there is no file, and size,
	// f's size as this log wrote it.
	mu   sync.Mutex
	f    *os.File
	size int64
}

// openAudit opens the audit log at path for appending, creating it with
// mode 0600, rotated past maxBytes (0: 100 MiB) keeping keep old files
// (0: 5). An empty path is a log that records nothing.
func openAudit(path string, maxBytes int64, keep int) (*auditLog, error) {
	if path == "" {
		return &auditLog{}, nil
	}
	if maxBytes <= 0 {
		maxBytes = defaultAuditMaxBytes
	}
	if keep <= 0 {
		keep = defaultAuditKeep
	}
	a := &auditLog{path: path, maxBytes: maxBytes, keep: keep}
	if err := a.openLocked(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *auditLog) openLocked() error {
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	a.f, a.size = f, fi.Size()
	return nil
}

// rotateLocked moves the file to FILE.1 (and the older ones along) and
// starts a new one.
func (a *auditLog) rotateLocked() error {
	if err := a.f.Close(); err != nil {
		return err
	}
	a.f = nil
	os.Remove(fmt.Sprintf("%s.%d", a.path, a.keep))
	for i := a.keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", a.path, i), fmt.Sprintf("%s.%d", a.path, i+1))
	}
	if err := os.Rename(a.path, a.path+".1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return a.openLocked()
}

// refused records a mutating call refused before it authenticated (or
// by the operator key), within refusedBounds.
func (a *auditLog) refused(r *http.Request, status int, err error) {
	e := auditEntry{Time: time.Now(), Call: clip(r.Method, 16) + " " + r.URL.Path, Status: status, Result: message(err), Remote: r.RemoteAddr}
	e.bound(refusedBounds)
	a.write(e)
}

// record appends e, stamping it with the current time if it has none,
// its fields within auditBounds. A write that fails is logged: the call
// it records has already happened.
func (a *auditLog) record(e auditEntry) {
	e.bound(auditBounds)
	a.write(e)
}

func (a *auditLog) write(e auditEntry) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	line, err := json.Marshal(e)
	if err != nil {
		slog.Error("audit log: encoding an entry", "err", err)
		return
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return
	}
	if a.size > 0 && a.size+int64(len(line)) > a.maxBytes {
		if err := a.rotateLocked(); err != nil {
			slog.Error("audit log: rotation failed", "path", a.path, "err", err)
			if a.f == nil {
				return
			}
		}
	}
	n, err := a.f.Write(line)
	a.size += int64(n)
	if err != nil {
		slog.Error("audit log: write failed", "path", a.path, "call", e.Call, "tenant", e.Tenant, "err", err)
	}
}

// Close closes the file; later entries are dropped.
func (a *auditLog) Close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	if err != nil {
		return fmt.Errorf("audit log %s: %w", a.path, err)
	}
	return nil
}
