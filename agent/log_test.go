package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCappedLogStaysUnderMaxAndKeepsNewestLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "init.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := &cappedLog{f: f, max: 4096, keep: 1024}
	for i := range 10000 {
		fmt.Fprintf(l, "line %d\n", i)
		if fi, _ := f.Stat(); fi.Size() > 4096 {
			t.Fatalf("log is %d bytes after line %d, over its 4096", fi.Size(), i)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.HasSuffix(s, "line 9999\n") || !strings.Contains(s, "line 9990\n") {
		t.Errorf("newest lines missing from the log's end:\n%s", s[max(0, len(s)-200):])
	}
	if !strings.Contains(s, "older lines dropped") {
		t.Errorf("log does not say lines were dropped:\n%s", s[:min(len(s), 200)])
	}
	if strings.Contains(s, "line 0\n") {
		t.Error("oldest line still in the log")
	}
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if !strings.HasPrefix(line, "line ") && !strings.Contains(line, "older lines dropped") {
			t.Fatalf("torn line %q in the log", line)
		}
	}
}

func TestCappedLogCutsOverlongLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "init.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := &cappedLog{f: f, max: 4096, keep: 1024}
	if n, err := l.Write([]byte(strings.Repeat("x", 100000) + "\n")); err != nil || n != 100001 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if fi, _ := f.Stat(); fi.Size() != 1024 {
		t.Errorf("an overlong line took %d bytes, want it cut to 1024", fi.Size())
	}
}
