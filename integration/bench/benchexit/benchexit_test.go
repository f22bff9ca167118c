package benchexit

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Fatal runs what was registered, newest first, and exits 1.
func TestFatalRunsCleanups(t *testing.T) {
	if out := os.Getenv("BENCHEXIT_OUT"); out != "" {
		AtExit(func() { appendTo(out, "first\n") })
		AtExit(func() { appendTo(out, "second\n") })
		Fatalf("failing on %s", "purpose")
		return
	}
	out := filepath.Join(t.TempDir(), "out")
	c := exec.Command(os.Args[0], "-test.run=^TestFatalRunsCleanups$")
	c.Env = append(os.Environ(), "BENCHEXIT_OUT="+out)
	err := c.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("want exit status 1, got %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil || string(b) != "second\nfirst\n" {
		t.Fatalf("clean-ups ran as %q (%v), want second then first", b, err)
	}
}

func appendTo(path, s string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	f.WriteString(s)
	f.Close()
}
