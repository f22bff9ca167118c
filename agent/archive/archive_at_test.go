package archive

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// swapForSymlink moves dir away (to dir+".moved") and leaves a symlink to
// target at its path, as someone racing a copy would.
func swapForSymlink(t *testing.T, dir, target string) {
	t.Helper()
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir); err != nil {
		t.Fatal(err)
	}
}

// A tree archived and extracted again keeps its names, types, modes,
// mtimes and link targets; owners are not carried.
func TestWriteTarRoundTrip(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, "d"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "d", "f"), []byte("data"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d/f", filepath.Join(src, "l")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "p"), 0o600); err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1e9, 123)
	for _, p := range []string{filepath.Join(src, "d", "f"), filepath.Join(src, "d")} {
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := WriteTar(&b, src, "top"); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(b.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s carries its owner: %d %q", h.Name, h.Uid, h.Uname)
		}
		names = append(names, h.Name)
	}
	if got, want := names, []string{"top/", "top/d/", "top/d/f", "top/l", "top/p"}; !slices.Equal(got, want) {
		t.Fatalf("entries %q, want %q", got, want)
	}
	dst := t.TempDir()
	if err := Extract(&b, dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dst, "top", "d", "f"))
	if err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) {
		t.Fatalf("d/f: %v %v %v", fi.Mode(), fi.ModTime(), err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "top", "d", "f")); string(got) != "data" {
		t.Fatalf("d/f reads %q", got)
	}
	if fi, err := os.Stat(filepath.Join(dst, "top", "d")); err != nil || fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(mtime) {
		t.Fatalf("d: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "top", "l")); err != nil || l != "d/f" {
		t.Fatalf("l: %q %v", l, err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "top", "p")); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
		t.Fatalf("p: %v %v", fi, err)
	}
}

// WriteTarAt archives the directory it was given open, even when its path
// now leads to a symlink elsewhere.
func TestWriteTarAtIsTheOpenDirectory(t *testing.T) {
	base := t.TempDir()
	src, outside := filepath.Join(base, "src"), filepath.Join(base, "outside")
	for d, content := range map[string]string{src: "inside", outside: "secret"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "f"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	swapForSymlink(t, src, outside)
	var b bytes.Buffer
	if err := WriteTarAt(&b, f, "src"); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := Extract(&b, dst, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "src", "f")); err != nil || string(got) != "inside" {
		t.Fatalf("src/f: %q %v: want the open directory's file", got, err)
	}
}

// ExtractAt writes into the directory it was given open, even when its
// path now leads to a symlink elsewhere.
func TestExtractAtIsTheOpenDirectory(t *testing.T) {
	base := t.TempDir()
	dst, outside := filepath.Join(base, "dst"), filepath.Join(base, "outside")
	for _, d := range []string{dst, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	root := os.NewFile(uintptr(fd), dst)
	defer root.Close()
	swapForSymlink(t, dst, outside)
	if err := ExtractAt(tarOf(t, entry{name: "f", typ: tar.TypeReg, data: "x"}), root, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written through the swapped path: %v", ents)
	}
	if got, err := os.ReadFile(filepath.Join(dst+".moved", "f")); err != nil || string(got) != "x" {
		t.Fatalf("f in the open directory: %q %v", got, err)
	}
}
