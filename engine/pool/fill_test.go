package pool

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A claim's refill starts only when the claimer lets it (StartFills),
// holding the pool's fillers.lock shared from the claim on, so that pool
// rm waits for it; the filler inherits the lock.
func TestDeferredFill(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "started")
	fake := filepath.Join(dir, "hutch")
	// The filler: it records its arguments and whether its descriptor 3
	// is the pool's fillers.lock.
	script := "#!/bin/sh\nls -l /proc/self/fd/3 > " + mark + ".fd\necho \"$@\" > " + mark + ".tmp && mv " + mark + ".tmp " + mark + "\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	f := Filler{
		Pools:   At(filepath.Join(root, "pools")),
		Command: []string{fake, "--root", root, "--runsc", "/runsc", "__pool-fill", "--lock-fd", "3"},
	}
	if err := os.MkdirAll(f.Pools.Dir("p"), 0o700); err != nil {
		t.Fatal(err)
	}
	lockPath := filepath.Join(f.Pools.Dir("p"), "fillers.lock")
	if err := os.WriteFile(lockPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	DeferFills()
	t.Cleanup(func() { deferFills.Store(false) })

	f.Kick("p", time.Minute)
	f.Kick("p", time.Minute) // one filler for both claims
	time.Sleep(50 * time.Millisecond)
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the filler started before StartFills")
	}
	unlock, ok, err := tryLockFile(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		unlock()
		t.Fatal("fillers.lock is free while a refill waits to start: pool rm would not wait for it")
	}
	StartFills()
	// The shell waits out the delay: the filler itself has not started.
	time.Sleep(50 * time.Millisecond)
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the filler started at once, not after its delay")
	}
	if _, ok, _ := tryLockFile(lockPath); ok {
		t.Fatal("fillers.lock is free while the filler waits out its delay")
	}
	ps, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	killed := false
	for _, p := range ps {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), fake) && strings.HasPrefix(string(b), "/bin/sh\x00") {
			// Cut the delay short: what the filler is handed is the point.
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			for _, c := range children(pid) {
				syscall.Kill(c, syscall.SIGTERM) //nolint:errcheck
			}
			killed = true
		}
	}
	if !killed {
		t.Fatal("no shell waits out the filler's delay")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(mark); err == nil {
			args := strings.Fields(string(b))
			want := []string{"--root", root, "--runsc", "/runsc", "__pool-fill", "--lock-fd", "3", "--delay", "0s", "p"}
			if !slices.Equal(args, want) {
				t.Errorf("filler args %q, want %q", args, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the filler did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fd, _ := os.ReadFile(mark + ".fd")
	if !strings.Contains(string(fd), lockPath) {
		t.Errorf("the filler's descriptor 3 is %q, want %s", fd, lockPath)
	}
}

// children are the PIDs whose parent is pid.
func children(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(s)))
			out = append(out, c)
		}
	}
	return out
}
