package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// Decisions an Entry records.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Entry is one connection in the egress log. Method and Path are of the
// first request where the gateway reads requests (plain HTTP, and TLS it
// terminates for an inject rule); a TLS connection passed through shows
// only its server name. Header values are never logged.
type Entry struct {
	Time     time.Time `json:"time"`
	Host     string    `json:"host"`
	Port     uint16    `json:"port"`
	Method   string    `json:"method,omitempty"`
	Path     string    `json:"path,omitempty"`
	Decision string    `json:"decision"`
	// Terminated: the gateway terminated TLS to inject headers.
	Terminated bool `json:"terminated,omitempty"`
	// Rule is the allow rule that let the connection through; Reason
	// says why it was refused.
	Rule   string `json:"rule,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Upstream is the address the gateway dialed; Error why that failed.
	Upstream string `json:"upstream,omitempty"`
	Error    string `json:"error,omitempty"`
	// BytesOut went from the sandbox to the upstream, BytesIn back.
	BytesOut   int64 `json:"bytes_out"`
	BytesIn    int64 `json:"bytes_in"`
	DurationMs int64 `json:"duration_ms"`
}

// MaxLogSize is the size past which the egress log is rotated: the
// current file becomes path.1 (replacing the one before), so a sandbox's
// log holds at most twice this on the host.
const MaxLogSize = 4 << 20

// Log is a sandbox's egress log: JSON lines, one Entry each.
type Log struct {
	path string
	// mu guards f and size: the file being written and its length.
	mu   sync.Mutex
	f    *os.File
	size int64
}

// OpenLog opens (or creates, 0600) the log at path for appending.
func OpenLog(path string) (*Log, error) {
	l := &Log{path: path}
	return l, l.openLocked()
}

func (l *Log) openLocked() error {
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Write appends e, rotating first if the log is full. A log that cannot
// be written loses the entry, never the connection.
func (l *Log) Write(e Entry) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	if l.size+int64(len(b)) > MaxLogSize {
		l.f.Close()
		l.f = nil
		os.Rename(l.path, l.path+".1") //nolint:errcheck // reopened below either way
		if err := l.openLocked(); err != nil {
			return
		}
	}
	n, _ := l.f.Write(b)
	l.size += int64(n)
}

// Close closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// ReadLog returns the entries of the log at path, the rotated file's
// first, oldest first. A missing log has none.
func ReadLog(path string) ([]Entry, error) {
	var out []Entry
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		err = readEntries(f, &out)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func readEntries(r io.Reader, out *[]Entry) error {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		var e Entry
		if json.Unmarshal(s.Bytes(), &e) == nil {
			*out = append(*out, e)
		}
	}
	return s.Err()
}
