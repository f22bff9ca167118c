package serve

import (
	"encoding/json"
	"fmt"
	"log/slog"
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
}

// auditLog appends entries to a file as JSON lines, one write per line, so
// lines from concurrent calls never interleave and other writers appending
// to the same file (O_APPEND) do not either. A log opened with no path
// records nothing. It is safe for concurrent use.
type auditLog struct {
	path string

	// mu guards f, nil once closed or when there is no file.
	mu sync.Mutex
	f  *os.File
}

// openAudit opens the audit log at path for appending, creating it with
// mode 0600. An empty path is a log that records nothing.
func openAudit(path string) (*auditLog, error) {
	if path == "" {
		return &auditLog{}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return &auditLog{path: path, f: f}, nil
}

// record appends e, stamping it with the current time if it has none. A
// write that fails is logged: the call it records has already happened.
func (a *auditLog) record(e auditEntry) {
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
	if _, err := a.f.Write(line); err != nil {
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
