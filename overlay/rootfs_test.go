package overlay

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// TestMain lets a test run this binary as a second process that unpacks an
// image (see TestRootfsTwoProcesses).
func TestMain(m *testing.M) {
	// The content store warns on every open where fs-verity is unsupported.
	_ = log.SetLevel("error")
	if root := os.Getenv("OVERLAY_TEST_CHILD_STORE"); root != "" {
		if err := childRootfs(root, os.Getenv("OVERLAY_TEST_CHILD_LEASE")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func childRootfs(root, lease string) error {
	ctx := context.Background()
	s, err := Open(root)
	if err != nil {
		return err
	}
	img, err := s.Get(ctx, "img")
	if err != nil {
		return err
	}
	p, err := s.Rootfs(ctx, img, lease)
	if err != nil {
		return err
	}
	fmt.Print(p)
	return nil
}

// treeState describes every path below root: type, mode, owner, size,
// content and (for comparisons across a rebuild) the inode.
func treeState(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		desc := fmt.Sprintf("mode=%o uid=%d size=%d ino=%d mtime=%d", st.Mode, st.Uid, st.Size, st.Ino, st.Mtim.Sec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			desc += " data=" + string(b)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " link=" + l
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func listTree(t testing.TB, root string) []string {
	var out []string
	for p := range treeState(t, root) {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func TestMultiLayerFlatten(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	l1 := makeTar(t,
		dir("a/"), file("a/gone", "1"), file("a/kept", "1"), file("a/replaced", "old"),
		dir("b/"), file("b/old", "1"), dir("b/sub/"), file("b/sub/deep", "1"),
		dir("h/"), file("h/orig", "shared"), file("h/rewritten", "parent"),
		dir("gonedir/"), file("gonedir/x", "1"),
	)
	ro := dir("h/")
	linkEntry := hardlink("c/link", "h/orig")
	linkEntry.mode = 0o600 // metadata applied to the target inode by archive.Apply
	l2 := makeTar(t,
		file("a/.wh.gone", ""),
		file("a/replaced", "new"),
		dir("b/"), file("b/.wh..wh..opq", ""), file("b/new", "2"),
		dir("c/"), linkEntry,
		file("c/f", "in-layer"), hardlink("c/g", "c/f"),
		ro, file("h/rewritten", "child"),
		file(".wh.gonedir", ""),
	)
	ar, _ := simpleArchive(t, layer{tar: l1, compression: "gzip"})
	base := importBytes(t, s, "base", ar)
	pp, err := s.Rootfs(ctx, base, "parent")
	if err != nil {
		t.Fatal(err)
	}
	before := treeState(t, pp)

	ar2, _ := simpleArchive(t, layer{tar: l1, compression: "gzip"}, layer{tar: l2})
	img := importBytes(t, s, "child", ar2)
	pc, err := s.Rootfs(ctx, img, "child")
	if err != nil {
		t.Fatal(err)
	}
	if pc == pp {
		t.Fatal("child and parent share a chain")
	}

	want := []string{".", "a", "a/kept", "a/replaced", "b", "b/new", "c", "c/f", "c/g", "c/link", "h", "h/orig", "h/rewritten"}
	if got := listTree(t, pc); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("child tree\n got %v\nwant %v", got, want)
	}
	for f, data := range map[string]string{"a/kept": "1", "a/replaced": "new", "b/new": "2", "c/link": "shared", "c/g": "in-layer", "h/rewritten": "child"} {
		if got := readFile(t, filepath.Join(pc, f)); got != data {
			t.Errorf("%s = %q, want %q", f, got, data)
		}
	}
	ino := func(p string) uint64 {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	if ino(filepath.Join(pc, "c/link")) != ino(filepath.Join(pc, "h/orig")) {
		t.Error("hard link in layer not a hard link")
	}
	if ino(filepath.Join(pc, "c/f")) != ino(filepath.Join(pc, "c/g")) {
		t.Error("hard link within the layer not a hard link")
	}
	if ino(filepath.Join(pc, "h/orig")) == ino(filepath.Join(pp, "h/orig")) {
		t.Error("hard link target still shares the parent's inode")
	}
	if ino(filepath.Join(pc, "a/kept")) != ino(filepath.Join(pp, "a/kept")) {
		t.Error("unchanged file copied instead of hard-linked")
	}

	// The parent chain is exactly as it was, inodes included.
	after := treeState(t, pp)
	for p, st := range before {
		if after[p] != st {
			t.Errorf("parent %s changed:\n before %s\n after  %s", p, st, after[p])
		}
	}
	if len(after) != len(before) {
		t.Errorf("parent has %d entries, had %d", len(after), len(before))
	}
}

func TestReadOnlyDirsAndSpecialFiles(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ro := dir("ro/")
	ro.mode = 0o555
	dev := entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666}
	fifo := entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600}
	l1 := makeTar(t, ro, file("ro/f", "1"), dir("dev/"), dev, dir("run/"), fifo, entry{name: "ro/x", typ: tar.TypeReg, mode: 0o400, data: "secret"})
	l2 := makeTar(t, ro, file("ro/g", "2"), file("ro/.wh.f", ""), file("ro/x", "replaced"))
	ar, _ := simpleArchive(t, layer{tar: l1}, layer{tar: l2, compression: "gzip"})
	img := importBytes(t, s, "ro", ar)
	p, err := s.Rootfs(ctx, img, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(listTree(t, filepath.Join(p, "ro")), " "); got != ". g x" {
		t.Fatalf("ro/ = %s", got)
	}
	if readFile(t, filepath.Join(p, "ro/x")) != "replaced" {
		t.Fatal("ro/x not replaced")
	}
	fi, err := os.Stat(filepath.Join(p, "ro"))
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("ro/ mode %v, %v", fi.Mode(), err)
	}
	// An image's FIFOs and device nodes are never created on the host,
	// not even as root.
	for _, special := range []string{"run/fifo", "dev/null"} {
		if fi, err := os.Lstat(filepath.Join(p, special)); err == nil {
			t.Fatalf("%s unpacked on the host as %v", special, fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Join(p, "run")); err != nil || !fi.IsDir() {
		t.Fatalf("run/ beside the dropped FIFO: %v %v", fi, err)
	}
	// Removal works even for directories without owner write permission.
	if err := s.Release(ctx, "sb"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, "ro"); err != nil {
		t.Fatal(err)
	}
	if e := rootfsEntries(t, s); len(e) != 0 {
		t.Fatalf("rootfs/ not empty: %v", e)
	}
}

func TestRootfsConcurrent(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ar, _ := simpleArchive(t, layer{tar: baseLayer(t), compression: "gzip"}, layer{tar: makeTar(t, file("etc/motd", "hi"))})
	img := importBytes(t, s, "img", ar)

	const n = 10
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A Store per goroutine, like separate processes.
			s2, err := Open(s.Root())
			if err == nil {
				paths[i], err = s2.Rootfs(ctx, img, fmt.Sprintf("sb-%d", i))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if paths[i] != paths[0] {
			t.Fatalf("different paths: %s %s", paths[i], paths[0])
		}
	}
	if got := rootfsEntries(t, s); len(got) != 2 { // the image's chain and its parent chain
		t.Fatalf("rootfs/ holds %v", got)
	}
	if readFile(t, filepath.Join(paths[0], "etc/motd")) != "hi" || readFile(t, filepath.Join(paths[0], "bin/hello")) != "hello world\n" {
		t.Fatal("incomplete rootfs")
	}
	leases, _ := os.ReadDir(filepath.Join(s.Root(), "leases"))
	if len(leases) != n {
		t.Fatalf("%d leases", len(leases))
	}
}

func TestRootfsTwoProcesses(t *testing.T) {
	s := newStore(t)
	// A big enough layer that the two unpacks overlap.
	var entries []entry
	for i := range 2000 {
		entries = append(entries, file(fmt.Sprintf("f%04d", i), strings.Repeat("x", 1000)))
	}
	ar, _ := simpleArchive(t, layer{tar: makeTar(t, entries...), compression: "gzip"})
	importBytes(t, s, "img", ar)

	var cmds []*exec.Cmd
	var outs, errOuts []*bytes.Buffer
	for i := range 2 {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "OVERLAY_TEST_CHILD_STORE="+s.Root(), fmt.Sprintf("OVERLAY_TEST_CHILD_LEASE=proc-%d", i))
		out, errOut := new(bytes.Buffer), new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = out, errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs, errOuts = append(cmds, cmd), append(outs, out), append(errOuts, errOut)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("process %d: %v: %s", i, err, errOuts[i])
		}
	}
	if outs[0].String() != outs[1].String() {
		t.Fatalf("processes returned %q and %q", outs[0], outs[1])
	}
	if got := rootfsEntries(t, s); len(got) != 1 {
		t.Fatalf("rootfs/ holds %v", got)
	}
	if got := len(listTree(t, outs[0].String())); got != 2001 {
		t.Fatalf("rootfs has %d entries", got)
	}
}

func TestBusyboxImage(t *testing.T) {
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		skipOutsideCI(t, "no busybox (Debian's busybox-static)")
	}
	a, err := BusyboxLayer(bb)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := BusyboxLayer(bb)
	if !bytes.Equal(a, b) {
		t.Fatal("BusyboxLayer is not deterministic")
	}
	ctx := context.Background()
	s := newStore(t)
	cfg := BusyboxConfig()
	img, err := s.Commit(ctx, CommitOptions{Name: "busybox", Layer: bytes.NewReader(a), Config: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Rootfs(ctx, img, "sb")
	if err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"bin/sh": "busybox", "bin/ls": "busybox", "usr/bin/env": "/bin/busybox"} {
		if got, err := os.Readlink(filepath.Join(p, link)); err != nil || got != target {
			t.Errorf("%s -> %q, %v", link, got, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(p, "tmp")); err != nil || fi.Mode()&(os.ModeSticky|0o777) != os.ModeSticky|0o777 {
		t.Errorf("tmp mode %v", fi.Mode())
	}
	if !strings.Contains(readFile(t, filepath.Join(p, "etc/passwd")), "user:x:1000:1000:user:/home/user:") {
		t.Error("no user in /etc/passwd")
	}
	out, err := exec.Command(filepath.Join(p, "bin/sh"), "-c", "echo ok").Output()
	if err != nil || string(out) != "ok\n" {
		t.Errorf("bin/sh -c: %q %v", out, err)
	}
	if img.Config.Config.Cmd[0] != "/bin/sh" || img.Config.Config.WorkingDir != "/" {
		t.Errorf("config %+v", img.Config.Config)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ownerOf(t testing.TB, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}
