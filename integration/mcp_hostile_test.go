package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// flipper swaps the directory allowed/d with the symlink allowed/.spare,
// which leads to outside, over and over (renameat2 RENAME_EXCHANGE: the
// name d is always there, one or the other), as another process of the
// user's, or a sandbox with the directory mounted, could while tool calls
// run. It stops when the test ends, or after limit at most.
func flipper(t *testing.T, allowed, outside string, limit time.Duration) {
	t.Helper()
	d, spare := filepath.Join(allowed, "d"), filepath.Join(allowed, ".spare")
	if err := os.Symlink(outside, spare); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for deadline := time.Now().Add(limit); time.Now().Before(deadline); {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, spare, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap %s and %s: %v", d, spare, err)
				return
			}
			// Pacing, not synchronisation: a swap every ~100 µs, many
			// within any tool call, without taking a whole core.
			time.Sleep(100 * time.Microsecond)
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// A download whose target directory is swapped for a symlink to another
// directory while the call runs writes nothing outside the allowed
// directory: the target is resolved once into a descriptor, from the
// allowed directory's, and the copy goes through it.
func TestHostileMCPDownloadRace(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	allowed, outside := filepath.Join(base, "allowed"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cs := mcpServe(t, e, "--allow-host-dir", allowed)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": "/payload/hook", "content": "#!/bin/sh\necho owned\n", "mode": "0755"}, nil)

	flipper(t, allowed, outside, 5*time.Minute)
	const rounds = 300
	copied, refused := 0, 0
	for i := range rounds {
		res := callTool(t, cs, "download_file", map[string]any{"sandbox_id": sb.SandboxID, "host_path": "d", "path": "/payload/hook"})
		switch msg := toolText(res); {
		case !res.IsError:
			copied++
		case strings.Contains(msg, "outside the allowed directory"):
			refused++
		default:
			t.Fatalf("round %d: download_file: %s", i, msg)
		}
		if ents, _ := os.ReadDir(outside); len(ents) > 0 {
			t.Fatalf("round %d of %d (%d copied, %d refused): download_file wrote %s outside the allowed directory", i+1, rounds, copied, refused, filepath.Join(outside, ents[0].Name()))
		}
	}
	t.Logf("%d downloads: %d copied, %d refused, nothing outside", rounds, copied, refused)
	// Both sides of the swap were seen, or the race was not run.
	if copied == 0 || refused == 0 {
		t.Fatalf("%d copied, %d refused: want both, the swap seen either way", copied, refused)
	}
}

// An upload whose source's directory is swapped for a symlink to another
// directory while the call runs never copies that other directory's file
// into the sandbox: the source is opened once, beneath the allowed
// directory, and copied from that descriptor.
func TestHostileMCPUploadRace(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	allowed, outside := filepath.Join(base, "allowed"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(allowed, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(allowed, "d", "f"), []byte("inside the allowed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Of the same size: a copy that stats one and reads the other
	// copies it whole.
	if err := os.WriteFile(filepath.Join(outside, "f"), []byte("SECRET of the host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := mcpServe(t, e, "--allow-host-dir", allowed)
	var sb mcpSandbox
	mustCall(t, cs, "create_sandbox", map[string]any{"image": "busybox"}, &sb)
	mustCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.SandboxID, "path": "/up/.keep", "content": ""}, nil)

	flipper(t, allowed, outside, 5*time.Minute)
	const rounds = 200
	copied, refused := 0, 0
	for i := range rounds {
		res := callTool(t, cs, "upload_file", map[string]any{"sandbox_id": sb.SandboxID, "host_path": "d/f", "path": fmt.Sprintf("/up/%d", i)})
		switch msg := toolText(res); {
		case !res.IsError:
			copied++
		case strings.Contains(msg, "outside the allowed directory"):
			refused++
		default:
			t.Fatalf("round %d: upload_file: %s", i, msg)
		}
	}
	var run mcpRun
	mustCall(t, cs, "run_command", map[string]any{"sandbox_id": sb.SandboxID, "command": "grep -l SECRET /up/* | wc -l; cat /up/* | sort | uniq -c"}, &run)
	t.Logf("%d uploads: %d copied, %d refused; in the sandbox:\n%s", rounds, copied, refused, run.Stdout)
	if n := strings.Fields(run.Stdout); len(n) == 0 || n[0] != "0" {
		t.Fatalf("upload_file copied the file outside the allowed directory into the sandbox: %s files hold it:\n%s", n[0], run.Stdout)
	}
	if copied == 0 || refused == 0 {
		t.Fatalf("%d copied, %d refused: want both, the swap seen either way", copied, refused)
	}
}
