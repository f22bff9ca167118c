package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The image's etc/passwd belongs to the sandbox: a FIFO there must not
// block the lookup, and a huge file is read only up to the limit.
func TestScanRootfsFileSpecial(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(root, "etc/passwd"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb := &record{Rootfs: root}
	done := make(chan bool)
	go func() {
		called := false
		(&Engine{}).scanRootfsFile(sb, "etc/passwd", func([]string) bool { called = true; return false })
		done <- called
	}()
	select {
	case called := <-done:
		if called {
			t.Fatal("a FIFO was read as etc/passwd")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("scanning a FIFO at etc/passwd blocked")
	}

	// A file longer than the limit: lines past it are not seen.
	line := "u:x:1:1::/:/bin/sh\n"
	big := strings.Repeat(line, maxRootfsFile/len(line)+1) + "last:x:2:2::/:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(root, "etc/group"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	var n int
	var sawLast bool
	(&Engine{}).scanRootfsFile(sb, "etc/group", func(f []string) bool { n++; sawLast = sawLast || f[0] == "last"; return false })
	if n == 0 || sawLast {
		t.Fatalf("read %d lines, saw the line past the limit: %v", n, sawLast)
	}
}
