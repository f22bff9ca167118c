package mcp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// hostTree makes an allowed directory with a file, a subdirectory, a
// symlink inside it, one out of it, a dangling one, and a directory
// beside it with a secret.
func hostTree(t *testing.T) (*hostDir, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "allowed")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(dir, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(dir, "a.txt"), filepath.Join(dir, "sub", "b.txt"), filepath.Join(outside, "secret")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"in": "sub", "out": outside, "outfile": filepath.Join(outside, "secret"),
		"dangling": filepath.Join(outside, "nothing"), "up": "..", "absin": filepath.Join(dir, "sub"), "proc": "/proc/self/root"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("nothing", filepath.Join(dir, "sub", "dangling")); err != nil {
		t.Fatal(err)
	}
	hd, err := newHostDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hd.close)
	return hd, outside
}

// outsideCases are paths that lead out of hostTree's directory.
var outsideCases = []string{"../outside/secret", "sub/../../outside/secret", "/etc/passwd", "out/secret", "outfile",
	"up/outside/secret", "absin/b.txt", "proc/etc/passwd"}

func TestHostDirSource(t *testing.T) {
	hd, outside := hostTree(t)
	for _, c := range []struct {
		path string
		want string // relative to the directory; "" for an error
		err  error
	}{
		{"a.txt", "a.txt", nil},
		{"./sub/../a.txt", "a.txt", nil},
		{hd.path + "/sub/b.txt", "sub/b.txt", nil},
		{"in/b.txt", "sub/b.txt", nil},
		{"in", "sub", nil},
		{".", ".", nil},
		{filepath.Join(outside, "secret"), "", errdefs.ErrPermissionDenied},
		{"missing", "", errdefs.ErrNotFound},
		{"", "", errdefs.ErrInvalidArgument},
		{"a\x00b", "", errdefs.ErrInvalidArgument},
	} {
		f, got, err := hd.openSource(c.path)
		if c.err != nil {
			if !errorIs(err, c.err) {
				t.Errorf("openSource(%q) = %q, %v: want %v", c.path, got, err, c.err)
			}
			continue
		}
		if err != nil || got != filepath.Join(hd.path, c.want) {
			t.Errorf("openSource(%q) = %q, %v: want %s", c.path, got, err, c.want)
			continue
		}
		f.Close()
	}
	for _, p := range outsideCases {
		if f, got, err := hd.openSource(p); !errorIs(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "outside the allowed directory") {
			t.Errorf("openSource(%q) = %q, %v: want it refused as outside", p, got, err)
			if f != nil {
				f.Close()
			}
		}
	}
}

func TestHostDirTarget(t *testing.T) {
	hd, outside := hostTree(t)
	for _, c := range []struct {
		path   string
		dir    string // the directory the copy goes into, relative
		rename string
		err    error
	}{
		{"new.txt", ".", "new.txt", nil},
		{"sub/new.txt", "sub", "new.txt", nil},
		{"in/new.txt", "sub", "new.txt", nil},
		{"a.txt", ".", "a.txt", nil},
		{"sub", "sub", "", nil},
		{"in", "sub", "", nil},
		{".", ".", "", nil},
		{"../new.txt", "", "", errdefs.ErrPermissionDenied},
		{filepath.Join(outside, "new.txt"), "", "", errdefs.ErrPermissionDenied},
		{"out/new.txt", "", "", errdefs.ErrPermissionDenied},
		{"out", "", "", errdefs.ErrPermissionDenied},
		{"up/x", "", "", errdefs.ErrPermissionDenied},
		{"dangling", "", "", errdefs.ErrPermissionDenied}, // absolute: outside
		{"sub/dangling", "", "", errdefs.ErrInvalidArgument},
		{"nodir/new.txt", "", "", errdefs.ErrNotFound},
		{"a.txt/new.txt", "", "", errdefs.ErrInvalidArgument},
	} {
		got, err := hd.openTarget(c.path)
		if c.err != nil {
			if !errorIs(err, c.err) {
				t.Errorf("openTarget(%q) = %+v, %v: want %v", c.path, got, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("openTarget(%q): %v", c.path, err)
			continue
		}
		want := filepath.Join(hd.path, c.dir)
		if got.rename != c.rename || got.path != filepath.Join(want, c.rename) {
			t.Errorf("openTarget(%q) = %q %q: want %s %q", c.path, got.rename, got.path, want, c.rename)
		}
		var st, wst unix.Stat_t
		if err := unix.Fstat(int(got.dir.Fd()), &st); err != nil || unix.Stat(want, &wst) != nil || st.Ino != wst.Ino {
			t.Errorf("openTarget(%q): the descriptor is not %s", c.path, want)
		}
		got.close()
	}
}

func TestHostDirOff(t *testing.T) {
	hd, err := newHostDir("")
	if err != nil {
		t.Fatal(err)
	}
	defer hd.close()
	_, _, serr := hd.openSource("a.txt")
	_, terr := hd.openTarget("a.txt")
	for _, err := range []error{serr, terr} {
		if !errorIs(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "--allow-host-dir") {
			t.Errorf("with no allowed directory: %v: want an error naming --allow-host-dir", err)
		}
	}
}

func TestNewHostDir(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := newHostDir(f); !errorIs(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a file as the directory: %v", err)
	}
	if _, err := newHostDir(filepath.Join(f, "missing")); err == nil {
		t.Error("a missing directory was accepted")
	}
}

// FuzzHostDirTarget checks that whatever path a client sends, what it
// opens is inside the allowed directory.
func FuzzHostDirTarget(f *testing.F) {
	for _, s := range []string{"a.txt", "../x", "/etc/passwd", "out/x", "in/../../x", "sub/./b.txt", "//x", "...", "up/x", "proc/x"} {
		f.Add(s)
	}
	base := f.TempDir()
	dir := filepath.Join(base, "allowed")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	for link, target := range map[string]string{"out": base, "in": "sub", "up": "..", "proc": "/proc/self/root"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			f.Fatal(err)
		}
	}
	hd, err := newHostDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(hd.close)
	inside := func(p string) bool { return p == hd.path || strings.HasPrefix(p, hd.path+"/") }
	f.Fuzz(func(t *testing.T, p string) {
		if src, shown, err := hd.openSource(p); err == nil {
			src.Close()
			if !inside(shown) {
				t.Fatalf("%q opened %q, outside %s", p, shown, hd.path)
			}
		}
		if dst, err := hd.openTarget(p); err == nil {
			dst.close()
			if !inside(dst.path) {
				t.Fatalf("%q resolved to %q, outside %s", p, dst.path, hd.path)
			}
		}
	})
}

// The remote backend's download creates its file in the target's
// directory: a symlink at the name is replaced, never written through;
// a directory there is refused.
func TestCreateIn(t *testing.T) {
	hd, outside := hostTree(t)
	dst, err := hd.openTarget("sub/link")
	if err != nil {
		t.Fatal(err)
	}
	defer dst.close()
	// A symlink out appears at the name after the check.
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(hd.path, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	f, err := createIn(dst.dir, dst.rename)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("new")
	f.Close()
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "x" {
		t.Fatalf("written through the symlink: the file outside reads %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(hd.path, "sub", "link")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("sub/link: %v %v, want the new regular file", fi, err)
	}
	if _, err := createIn(dst.dir, "."); err == nil {
		t.Fatal("createIn over a directory succeeded")
	}
}
