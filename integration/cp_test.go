package integration

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fileState is what a copy must keep of a file.
type fileState struct {
	mode  fs.FileMode
	mtime int64 // seconds: what every filesystem on the way keeps
	link  string
	data  string
}

func treeState(t *testing.T, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fileState{mode: fi.Mode(), mtime: fi.ModTime().Unix()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			st.link, _ = os.Readlink(p)
			st.mtime = 0 // symlink times are not compared
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			st.data = string(b)
		}
		if rel == "." {
			st.mtime = 0 // the top directory is the destination's own
		}
		out[rel] = st
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func makeTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "sub", "empty"), 0o755))
	must(os.WriteFile(filepath.Join(root, "plain.txt"), []byte("hello\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "secret"), []byte("s"), 0o600))
	must(os.WriteFile(filepath.Join(root, "sub", "tool.sh"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(os.Symlink("../plain.txt", filepath.Join(root, "sub", "rel-link")))
	must(os.Symlink("/etc/hostname", filepath.Join(root, "abs-link")))
	must(os.Symlink("nowhere", filepath.Join(root, "dangling")))
	must(os.Chmod(filepath.Join(root, "sub", "empty"), 0o700))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"plain.txt", "secret", "sub/tool.sh", "sub/empty", "sub"} {
		must(os.Chtimes(filepath.Join(root, p), old, old.Add(time.Duration(len(p))*time.Hour)))
	}
}

// A tree goes into a sandbox and back out unchanged: contents, modes,
// mtimes, symlinks as symlinks.
func TestCpRoundTrip(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	host := t.TempDir()
	src := filepath.Join(host, "proj")
	makeTree(t, src)

	e.ok("cp", src, id+":/root/")
	out := e.ok("exec", id, "--", "sh", "-c", "cd /root/proj && stat -c '%n %a' plain.txt secret sub/tool.sh sub/empty && readlink sub/rel-link && readlink abs-link && sh sub/tool.sh && cat sub/rel-link")
	want := "plain.txt 644\nsecret 600\nsub/tool.sh 755\nsub/empty 700\n../plain.txt\n/etc/hostname\ntool\nhello\n"
	if out != want {
		t.Fatalf("inside the sandbox:\n%s\nwant:\n%s", out, want)
	}

	back := filepath.Join(host, "back")
	e.ok("cp", id+":/root/proj", back)
	assertSameTree(t, src, back)

	// Into an existing directory, the source keeps its name; "DIR/."
	// copies the contents; a file can be renamed; /tmp is the sandbox's.
	e.ok("cp", filepath.Join(src, "plain.txt"), id+":/tmp/renamed.txt")
	if got := e.ok("exec", id, "--", "cat", "/tmp/renamed.txt"); got != "hello\n" {
		t.Fatalf("/tmp/renamed.txt: %q", got)
	}
	e.ok("exec", id, "--", "mkdir", "/tmp/contents")
	e.ok("cp", src+"/.", id+":/tmp/contents")
	into := filepath.Join(host, "into")
	if err := os.Mkdir(into, 0o755); err != nil {
		t.Fatal(err)
	}
	e.ok("cp", id+":/tmp/contents", into)
	assertSameTree(t, src, filepath.Join(into, "contents"))
	fresh := filepath.Join(host, "fresh")
	e.ok("cp", id+":/tmp/contents/.", fresh)
	assertSameTree(t, src, fresh)
}

func assertSameTree(t *testing.T, a, b string) {
	t.Helper()
	sa, sb := treeState(t, a), treeState(t, b)
	if len(sa) != len(sb) {
		t.Fatalf("%s has %d entries, %s has %d:\n%v\n%v", a, len(sa), b, len(sb), sa, sb)
	}
	for name, want := range sa {
		if got, ok := sb[name]; !ok || got != want {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
}

// The sandbox is hostile: a symlink it planted must not lead a copy out
// of it to write anywhere but the destination; ".." is refused.
func TestCpRefusesEscapes(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	host := t.TempDir()
	victim := filepath.Join(host, "victim")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(host, "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}

	// A symlink in the sandbox pointing at a host path comes out as a
	// symlink, and nothing is written where it points.
	e.ok("exec", id, "--", "sh", "-c", "mkdir /data && ln -s "+victim+" /data/link && ln -s "+victim+" /evil")
	e.ok("cp", id+":/data", dst)
	if l, err := os.Readlink(filepath.Join(dst, "data", "link")); err != nil || l != victim {
		t.Fatalf("data/link should be a symlink to %s: %q %v", victim, l, err)
	}
	e.ok("cp", id+":/evil", filepath.Join(dst, "evil"))
	if l, err := os.Readlink(filepath.Join(dst, "evil")); err != nil || l != victim {
		t.Fatalf("evil should be a symlink: %q %v", l, err)
	}

	// The attack: the sandbox turns the symlink into a directory with a
	// file in it, and the same copy runs again into the same place. A
	// careless extractor would follow the symlink it made the first time.
	e.ok("exec", id, "--", "sh", "-c", "rm /data/link && mkdir /data/link && echo pwned > /data/link/pwned")
	r := e.run(nil, "cp", id+":/data", dst)
	assertOneLineError(t, r, "not a directory")
	if ents, _ := os.ReadDir(victim); len(ents) != 0 {
		t.Fatalf("the copy wrote through a planted symlink into %s: %v", victim, ents)
	}

	for _, args := range [][]string{
		{"cp", id + ":/root/../../etc/passwd", host},
		{"cp", id + ":../../etc/passwd", host},
		{"cp", filepath.Join(host, "victim"), id + ":/tmp/../../x"},
	} {
		r := e.run(nil, args...)
		assertOneLineError(t, r, `".." is not allowed`)
	}
	assertOneLineError(t, e.run(nil, "cp", id+":/no/such", host), "no such file")
	assertOneLineError(t, e.run(nil, "cp", filepath.Join(host, "nope"), id+":/tmp/"), "no such file")
	assertOneLineError(t, e.run(nil, "cp", host, filepath.Join(host, "x")), "ID:PATH")
}

// A 1 GiB file copies out and back in through hutch in constant memory.
// (Content fidelity is TestCpRoundTrip's; this one is about memory.)
func TestCpLargeFileConstantMemory(t *testing.T) {
	e := newEnv(t)
	id := e.create("--memory", "3g")
	e.ok("exec", id, "--", "sh", "-c", "head -c 1073741824 /dev/zero > /root/big && echo end >> /root/big")
	const size = 1<<30 + 4

	host := t.TempDir()
	out := filepath.Join(host, "big")
	assertBoundedMemory(t, "cp out", e.cmd(nil, "cp", id+":/root/big", out))
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	tail := make([]byte, 4)
	f.ReadAt(tail, size-4)
	f.Close()
	if fi.Size() != size || string(tail) != "end\n" {
		t.Fatalf("copied out %d bytes ending in %q, want %d ending in \"end\\n\"", fi.Size(), tail, size)
	}

	assertBoundedMemory(t, "cp in", e.cmd(nil, "cp", out, id+":/root/big2"))
	if got := e.ok("exec", id, "--", "sh", "-c", "stat -c %s /root/big2; tail -c 4 /root/big2"); got != "1073741828\nend\n" {
		t.Fatalf("copied back in: size and tail %q", got)
	}
}

// assertBoundedMemory runs c, a hutch command moving 1 GiB, to success
// and checks that hutch's own peak resident memory (VmHWM, read until it
// exits) stays under 64 MiB: wait4's rusage would also count a runsc
// child that hutch may start.
func assertBoundedMemory(t *testing.T, what string, c *exec.Cmd) {
	t.Helper()
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	hwm := watchPeakMemory(c.Process.Pid)
	if err := c.Wait(); err != nil {
		t.Fatalf("%s: %v: %s", what, err, out.Bytes())
	}
	if peak := hwm(); peak == 0 {
		t.Fatalf("%s: could not read hutch's peak memory from /proc", what)
	} else if peak > 64<<20 {
		t.Fatalf("%s: hutch used %d MiB of memory for 1 GiB; want constant memory (< 64 MiB)", what, peak>>20)
	}
}

// watchPeakMemory follows process pid's VmHWM until it exits; the
// returned function waits for that and gives the last value read.
func watchPeakMemory(pid int) func() int64 {
	var hwm atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		status := fmt.Sprintf("/proc/%d/status", pid)
		for {
			b, err := os.ReadFile(status)
			if err != nil {
				return
			}
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
					if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64); err == nil {
						hwm.Store(kb << 10)
					}
				}
				if strings.HasPrefix(l, "State:") && strings.Contains(l, "zombie") {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() int64 { <-done; return hwm.Load() }
}
