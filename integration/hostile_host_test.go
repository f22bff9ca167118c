package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// initLogMax is the most a sandbox's log may take on the host.
const initLogMax = 8 << 20

// The init closes its /proc/1/fd (the host's log file) to the sandbox's
// processes once its runtime runs: create returns only after that, so the
// first command in a new sandbox already finds it closed.
func TestCreateWaitsForInit(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		id := e.create()
		logPath := filepath.Join(e.root, "sandboxes", id, "init.log")
		b, err := os.ReadFile(logPath)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(" init started\n")) {
			t.Fatalf("create %d returned before the sandbox's init started; its log: %q", i, b)
		}
		r := e.run(nil, "exec", id, "--", "sh", "-c", "echo forged >> /proc/1/fd/1")
		if r.code == 0 {
			t.Fatalf("create %d: the first command wrote to the host's log through /proc/1/fd/1: %s", i, r)
		}
		if b, _ := os.ReadFile(logPath); bytes.Contains(b, []byte("forged")) {
			t.Fatalf("create %d: the sandbox's log holds a line written through /proc/1/fd/1: %q", i, b)
		}
		e.ok("rm", "-f", id)
	}
}

// A process printing without end inside a sandbox, or root writing to the
// init's log through /proc/1/fd, must not fill the host's state disk: the
// log on the host stays under its cap and `hutch logs` still shows the
// newest lines. `hutch logs -f`, following it all along, writes whole lines,
// each once, in order, and goes on past each cut of the log.
func TestHostileInitLogIsBounded(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	logPath := filepath.Join(e.root, "sandboxes", id, "init.log")

	r := e.run(nil, "exec", id, "--", "sh", "-c", "head -c 16777216 /dev/zero > /proc/1/fd/1")
	if fi, err := os.Stat(logPath); err != nil || fi.Size() > 1<<20 {
		t.Fatalf("root in the sandbox wrote to the host's log through /proc/1/fd/1 (%v, %v): %s", fi.Size(), err, r)
	}

	var followed bytes.Buffer
	follow := e.cmd(nil, "logs", "-f", id)
	follow.Stdout = &followed
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		follow.Process.Kill()
		follow.Wait()
	}()
	e.ok("exec", id, "--", "/.hutch/hutch-init", "spawn", "--", "yes", "flood")
	var largest int64
	cut := false
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && !cut; time.Sleep(200 * time.Millisecond) {
		fi, err := os.Stat(logPath)
		if err != nil {
			t.Fatal(err)
		}
		largest = max(largest, fi.Size())
		if largest > initLogMax {
			t.Fatalf("the sandbox log on the host reached %d bytes, over %d", largest, initLogMax)
		}
		head := make([]byte, 200)
		f, err := os.Open(logPath)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := f.Read(head)
		f.Close()
		cut = bytes.Contains(head[:n], []byte("older lines dropped"))
	}
	if !cut {
		t.Fatalf("the log was never cut in 60 s of `yes` (largest %d bytes): is `yes` logged at all?", largest)
	}
	// Some more cuts: the file stays bounded under sustained output.
	for range 15 {
		time.Sleep(200 * time.Millisecond)
		if fi, err := os.Stat(logPath); err != nil || fi.Size() > initLogMax {
			t.Fatalf("the sandbox log on the host is %d bytes, over %d (%v)", fi.Size(), initLogMax, err)
		}
	}
	t0 := time.Now().UTC().Add(-5 * time.Second)
	lines := strings.Split(strings.TrimSpace(e.ok("logs", id)), "\n")
	last := lines[len(lines)-1]
	ts, err := time.Parse("2006-01-02T15:04:05.000000Z", strings.Fields(last)[0])
	if !strings.HasSuffix(last, " flood") || err != nil || ts.Before(t0) {
		t.Errorf("`hutch logs` does not end with a recent line of the flood: %q", last)
	}

	follow.Process.Kill()
	follow.Wait()
	out := followed.String()
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[:i] // the kill may have cut a write short
	}
	var prev time.Time
	flood := 0
	for n, line := range strings.Split(out, "\n") {
		stamp, _, _ := strings.Cut(line, " ")
		ts, err := time.Parse("2006-01-02T15:04:05.000000Z", stamp)
		switch {
		case err != nil:
			t.Fatalf("`hutch logs -f`, line %d, is not whole: %q", n+1, line)
		case strings.HasSuffix(line, "older lines dropped"):
			// The follower fell behind by more than the init keeps
			// at a cut: the note, stamped with the cut's time,
			// comes before the newest lines it kept.
			continue
		case ts.Before(prev):
			t.Fatalf("`hutch logs -f`, line %d, comes after a newer one (%s): %q", n+1, prev.Format(time.RFC3339Nano), line)
		case strings.HasSuffix(line, " flood"):
			flood++
		}
		prev = ts
	}
	if flood == 0 || prev.Before(t0) {
		t.Errorf("`hutch logs -f` followed %d lines of the flood, the last at %s: not past the log's cuts", flood, prev.Format(time.RFC3339Nano))
	}
}

// runsc, its gofer and the sandbox process get no variable of hutch's
// environment beyond what runsc reads: a secret in the environment of the
// program that runs hutch never reaches a process the sandbox can attack.
func TestHostileRunscEnvironment(t *testing.T) {
	e := newEnv(t)
	b := make([]byte, 16)
	rand.Read(b)
	secret := "hutchtest" + hex.EncodeToString(b)
	e.extra = append(e.extra, "PLATFORM_API_TOKEN="+secret)
	id := e.create()
	e.ok("exec", id, "--", "true")
	pid := e.inspect(id).Pid
	if pid <= 0 {
		t.Fatalf("sandbox %s has no process", id)
	}
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(environ, []byte(secret)) {
		t.Errorf("the sandbox process (PID %d) has hutch's PLATFORM_API_TOKEN in its environment", pid)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(secret)) {
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			t.Errorf("%s (%s) has hutch's PLATFORM_API_TOKEN in its environment", filepath.Dir(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
}

// A secret reference naming a huge file, a FIFO or a device is refused at
// once, before anything of it is read: hutch neither reads 2 GiB into memory
// nor blocks on a FIFO that no one writes.
func TestHostileSecretFiles(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{huge, "larger than"},
		{fifo, "not a regular file"},
		{"/dev/zero", "not a regular file"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c := e.cmd(nil, "create", "--image", "busybox", "--secret", "TOKEN=@"+tc.path)
		cmd := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
		cmd.Env = c.Env
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		hung := ctx.Err() != nil
		cancel()
		if hung {
			t.Errorf("hutch create --secret TOKEN=@%s hung", tc.path)
			continue
		}
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("hutch create --secret TOKEN=@%s: %v: %s; want a refusal naming %q", tc.path, err, out, tc.want)
		}
		if d > time.Second {
			t.Errorf("refusing --secret TOKEN=@%s took %v", tc.path, d)
		}
	}
	if ids := strings.Fields(e.ok("ls", "-q")); len(ids) != 0 {
		t.Errorf("refused creates left sandboxes: %v", ids)
	}
}

// A sparse file costs its sandbox nothing against --disk; `hutch cp` out of
// the sandbox must not turn it into gigabytes on the host's disk.
func TestHostileSparseFileCopyOut(t *testing.T) {
	e := newEnv(t)
	id := e.create("--disk", "64m")
	e.ok("exec", id, "--", "sh", "-c", "dd of=/root/sparse bs=1 seek=1G count=0 2>/dev/null && echo end >> /root/sparse")
	dst := filepath.Join(t.TempDir(), "sparse")
	e.ok("cp", id+":/root/sparse", dst)
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 1<<30+4 {
		t.Errorf("copied %d bytes, want %d", fi.Size(), 1<<30+4)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > 1<<20 {
		t.Errorf("a 1 GiB sparse file from a --disk 64m sandbox takes %d bytes of the host's disk", used)
	}
	b := make([]byte, 4)
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 1<<30); err != nil || string(b) != "end\n" {
		t.Errorf("the copy's last bytes are %q (%v), want %q", b, err, "end\n")
	}
}
