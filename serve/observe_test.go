package serve

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A log page holds at most its limit of lines and maxLogBytes, each line
// cut at maxLogLine, and pages on by a cursor in either direction.
func TestLogPage(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var log strings.Builder
	for i := range 100 {
		fmt.Fprintf(&log, "%s line %d\n", t0.Add(time.Duration(i)*time.Second).Format(time.RFC3339Nano), i)
	}
	page := func(p *logPage, input string) []string {
		t.Helper()
		// Written in uneven pieces, as a file is copied.
		for b := []byte(input); len(b) > 0; {
			n := min(len(b), 37)
			if _, err := p.Write(b[:n]); err != nil {
				break
			}
			b = b[n:]
		}
		p.flush()
		var out []string
		for _, l := range p.lines {
			out = append(out, l.text)
		}
		return out
	}
	at := func(i int) *time.Time { c := t0.Add(time.Duration(i) * time.Second); return &c }
	for _, c := range []struct {
		name        string
		p           *logPage
		first, last string
		n           int
	}{
		{"the newest lines", &logPage{limit: 10, tail: true}, "line 90", "line 99", 10},
		{"forward from a cursor", &logPage{limit: 10, cursor: at(20)}, "line 20", "line 29", 10},
		{"backward from a cursor", &logPage{limit: 10, cursor: at(20), backward: true, tail: true}, "line 10", "line 19", 10},
		{"forward past the end", &logPage{limit: 10, cursor: at(95)}, "line 95", "line 99", 5},
	} {
		got := page(c.p, log.String())
		if len(got) != c.n || got[0] != c.first || got[len(got)-1] != c.last {
			t.Errorf("%s: %d lines %q ... %q, want %d, %q ... %q", c.name, len(got), got[0], got[len(got)-1], c.n, c.first, c.last)
		}
	}

	// Long lines: each is cut, and the page stays within its bytes.
	long := strings.Repeat("x", 3*maxLogLine)
	var big strings.Builder
	for i := range 2 * maxLogBytes / maxLogLine {
		fmt.Fprintf(&big, "%s %d%s\n", t0.Add(time.Duration(i)*time.Millisecond).Format(time.RFC3339Nano), i, long)
	}
	for _, p := range []*logPage{{limit: 10000, tail: true}, {limit: 10000, cursor: at(0)}} {
		got := page(p, big.String())
		total := 0
		for _, l := range got {
			if len(l) > maxLogLine {
				t.Fatalf("a line of %d bytes, past maxLogLine %d", len(l), maxLogLine)
			}
			total += len(l)
		}
		if total > maxLogBytes || len(got) == 0 {
			t.Errorf("tail %v: %d lines of %d bytes, want some within %d", p.tail, len(got), total, maxLogBytes)
		}
	}
}
