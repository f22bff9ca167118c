package engine

import (
	"os"
	"path/filepath"
	"testing"
)

// rewritePaths moves the paths a former state root's records hold, and
// only those: a longer name that merely begins like the old root, a path
// inside a longer string, and a content-addressed blob keep their bytes.
func TestRewritePaths(t *testing.T) {
	dir := t.TempDir()
	old, new := "/home/u/.local/share/"+FormerName, "/home/u/.local/share/hutch"
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	record := `{"rootfs":"` + old + `/images/rootfs/abc","root":"` + old + `","other":"` + old + `-images/x","note":"see ` + old + `/x"}`
	write("sandboxes/a/record.json", record)
	write("images/blobs/sha256/ff", record)
	write("sandboxes/a/log.txt", old+"/x")
	if err := os.Symlink(old+"/images/rootfs/abc", filepath.Join(dir, "sandboxes/a/rootfs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/elsewhere", filepath.Join(dir, "sandboxes/a/other")); err != nil {
		t.Fatal(err)
	}
	n, err := rewritePaths(dir, old, new)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("rewrote %d files, want 2 (the record and one link)", n)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	want := `{"rootfs":"` + new + `/images/rootfs/abc","root":"` + new + `","other":"` + old + `-images/x","note":"see ` + old + `/x"}`
	if got := read("sandboxes/a/record.json"); got != want {
		t.Errorf("record:\n got %s\nwant %s", got, want)
	}
	if got := read("images/blobs/sha256/ff"); got != record {
		t.Errorf("a blob changed: %s", got)
	}
	if got := read("sandboxes/a/log.txt"); got != old+"/x" {
		t.Errorf("a file that is not a record changed: %s", got)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "sandboxes/a/rootfs")); l != new+"/images/rootfs/abc" {
		t.Errorf("link into the root: %s", l)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "sandboxes/a/other")); l != "/elsewhere" {
		t.Errorf("link out of the root changed: %s", l)
	}
}

// The detector stays quiet when HUTCH_ROOT chooses the root, and when the
// root asked for is not the default one.
func TestCheckFormerStateQuiet(t *testing.T) {
	t.Setenv("HUTCH_ROOT", t.TempDir())
	if err := CheckFormerState(DefaultRoot()); err != nil {
		t.Errorf("with HUTCH_ROOT set: %v", err)
	}
	t.Setenv("HUTCH_ROOT", "")
	if err := CheckFormerState(t.TempDir()); err != nil {
		t.Errorf("with a root that is not the default: %v", err)
	}
}
