package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// A log read while the init writes it: whole lines only, the one being
// written once it is whole, and across the init's cuts each line once.
func TestLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "init.log")
	w, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out bytes.Buffer
	l := &logLines{f: r, out: &out}
	step := func(name string, write func(), final bool, want string) {
		t.Helper()
		write()
		out.Reset()
		if err := l.copy(final); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if out.String() != want {
			t.Errorf("%s: wrote %q, want %q", name, out.String(), want)
		}
	}
	add := func(s string) func() { return func() { w.WriteString(s) } }
	// cut empties the log and writes back a note and the newest lines,
	// as the init's cappedLog does.
	cut := func(s string) func() {
		return func() {
			w.Truncate(0)
			w.Seek(0, 0)
			w.WriteString(s)
		}
	}
	step("whole lines", add("t1 a\nt2 b\nt3 c"), false, "t1 a\nt2 b\n")
	step("a line half written", add("cc"), false, "")
	step("its end", add("c\nt4 d\n"), false, "t3 cccc\nt4 d\n")
	step("nothing new", func() {}, false, "")
	step("a cut, then new lines", cut("t9 note\nt3 cccc\nt4 d\nt5 e\n"), false, "t5 e\n")
	step("more", add("t6 f\n"), false, "t6 f\n")
	// The reader finds the log emptied, before the init writes back.
	step("a cut seen half done", func() { w.Truncate(0); w.Seek(0, 0) }, false, "")
	step("its write-back", add("t10 note\nt5 e\nt6 f\nt7 g\n"), false, "t7 g\n")
	step("a cut that dropped lines not yet read", cut("t20 note\nt18 x\n"), false, "t20 note\nt18 x\n")
	step("the end, without a newline", add("t21 y"), true, "t21 y")
}

func TestLastLine(t *testing.T) {
	for _, tc := range []struct {
		b, line string
		want    int
	}{
		{"a\nb\na\n", "a\n", 4},
		{"xa\n", "a\n", -1},
		{"a\nxa\n", "a\n", 0},
		{"", "a\n", -1},
		{"b\n", "a\n", -1},
	} {
		if got := lastLine([]byte(tc.b), []byte(tc.line)); got != tc.want {
			t.Errorf("lastLine(%q, %q) = %d, want %d", tc.b, tc.line, got, tc.want)
		}
	}
}
