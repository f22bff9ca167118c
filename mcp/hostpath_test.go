package mcp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// hostTree makes an allowed directory with a file, a subdirectory, a
// symlink inside it, one out of it, a dangling one, and a directory
// beside it with a secret.
func hostTree(t *testing.T) (hostDir, string) {
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
	for link, target := range map[string]string{"in": "sub", "out": outside, "outfile": filepath.Join(outside, "secret"), "dangling": filepath.Join(outside, "nothing")} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	hd, err := newHostDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return hd, outside
}

func TestHostDirSource(t *testing.T) {
	hd, outside := hostTree(t)
	for _, c := range []struct {
		path string
		want string // relative to the directory; "" for an error
		err  error
	}{
		{"a.txt", "a.txt", nil},
		{"./sub/../a.txt", "a.txt", nil},
		{string(hd) + "/sub/b.txt", "sub/b.txt", nil},
		{"in/b.txt", "sub/b.txt", nil},
		{".", ".", nil},
		{"../outside/secret", "", errdefs.ErrPermissionDenied},
		{"sub/../../outside/secret", "", errdefs.ErrPermissionDenied},
		{filepath.Join(outside, "secret"), "", errdefs.ErrPermissionDenied},
		{"/etc/passwd", "", errdefs.ErrPermissionDenied},
		{"out/secret", "", errdefs.ErrPermissionDenied},
		{"outfile", "", errdefs.ErrPermissionDenied},
		{"missing", "", errdefs.ErrNotFound},
		{"", "", errdefs.ErrInvalidArgument},
		{"a\x00b", "", errdefs.ErrInvalidArgument},
	} {
		got, err := hd.source(c.path)
		if c.err != nil {
			if !errorIs(err, c.err) {
				t.Errorf("source(%q) = %q, %v: want %v", c.path, got, err, c.err)
			}
			continue
		}
		if err != nil || got != filepath.Join(string(hd), c.want) {
			t.Errorf("source(%q) = %q, %v: want %s", c.path, got, err, c.want)
		}
	}
}

func TestHostDirTarget(t *testing.T) {
	hd, outside := hostTree(t)
	for _, c := range []struct {
		path string
		want string
		err  error
	}{
		{"new.txt", "new.txt", nil},
		{"sub/new.txt", "sub/new.txt", nil},
		{"in/new.txt", "sub/new.txt", nil},
		{"a.txt", "a.txt", nil},
		{"sub", "sub", nil},
		{"../new.txt", "", errdefs.ErrPermissionDenied},
		{filepath.Join(outside, "new.txt"), "", errdefs.ErrPermissionDenied},
		{"out/new.txt", "", errdefs.ErrPermissionDenied},
		{"out", "", errdefs.ErrPermissionDenied},
		{"dangling", "", errdefs.ErrInvalidArgument},
		{"nodir/new.txt", "", errdefs.ErrNotFound},
	} {
		got, err := hd.target(c.path)
		if c.err != nil {
			if !errorIs(err, c.err) {
				t.Errorf("target(%q) = %q, %v: want %v", c.path, got, err, c.err)
			}
			continue
		}
		if err != nil || got != filepath.Join(string(hd), c.want) {
			t.Errorf("target(%q) = %q, %v: want %s", c.path, got, err, c.want)
		}
	}
}

func TestHostDirOff(t *testing.T) {
	var hd hostDir
	for _, f := range []func(string) (string, error){hd.source, hd.target} {
		if _, err := f("a.txt"); !errorIs(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "--allow-host-dir") {
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

// FuzzHostDirTarget checks that whatever path a client sends, a resolved
// path is inside the allowed directory.
func FuzzHostDirTarget(f *testing.F) {
	for _, s := range []string{"a.txt", "../x", "/etc/passwd", "out/x", "in/../../x", "sub/./b.txt", "//x", "..."} {
		f.Add(s)
	}
	base := f.TempDir()
	dir := filepath.Join(base, "allowed")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(base, filepath.Join(dir, "out")); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("sub", filepath.Join(dir, "in")); err != nil {
		f.Fatal(err)
	}
	hd, err := newHostDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		for _, resolve := range []func(string) (string, error){hd.source, hd.target} {
			got, err := resolve(p)
			if err != nil {
				continue
			}
			if got != string(hd) && !strings.HasPrefix(got, string(hd)+"/") {
				t.Fatalf("%q resolved to %q, outside %s", p, got, hd)
			}
		}
	})
}
