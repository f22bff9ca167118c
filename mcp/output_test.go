package mcp

import (
	"strings"
	"testing"
)

func TestCapture(t *testing.T) {
	for _, c := range []struct {
		name   string
		limit  int
		writes []string
		want   string
		cut    int64
	}{
		{"empty", 10, nil, "", 0},
		{"under", 10, []string{"hello"}, "hello", 0},
		{"exactly", 10, []string{"0123456789"}, "0123456789", 0},
		{"over in one write", 10, []string{"abcdefghijklmnopqrstuvwxyz"}, "abcde\n[... 16 bytes cut from the middle of 26 bytes of output", 16},
		{"over in small writes", 4, strings.Split("abcdefgh", ""), "ab\n[... 4 bytes cut from the middle of 8 bytes of output", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newCapture(c.limit)
			for _, s := range c.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", s, n, err)
				}
			}
			got := w.String()
			if !strings.HasPrefix(got, c.want) || w.Cut() != c.cut {
				t.Fatalf("String() = %q, Cut() = %d: want prefix %q, cut %d", got, w.Cut(), c.want, c.cut)
			}
			if c.cut > 0 {
				all := strings.Join(c.writes, "")
				if tail := all[len(all)-(c.limit-c.limit/2):]; !strings.HasSuffix(got, "\n"+tail) {
					t.Fatalf("String() = %q: want it to end with the last bytes %q", got, tail)
				}
			}
		})
	}
}

// A long stream through many writes keeps its ends and bounded memory.
func TestCaptureLong(t *testing.T) {
	w := newCapture(1000)
	w.Write([]byte("START"))
	for i := 0; i < 100000; i++ {
		w.Write([]byte("0123456789"))
	}
	w.Write([]byte("END"))
	got := w.String()
	if !strings.HasPrefix(got, "START") || !strings.HasSuffix(got, "789END") || w.Cut() != 5+1000000+3-1000 {
		t.Fatalf("got %d bytes, cut %d: %q...%q", len(got), w.Cut(), got[:20], got[len(got)-20:])
	}
	if cap(w.tail) > 4*1000+8192 {
		t.Fatalf("tail buffer grew to %d bytes", cap(w.tail))
	}
}
