package overlay

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"
)

// Each layer's entries apply over its parent's in order: a later owner
// wins, root's drops the entry, a whiteout or an opaque directory drops
// what it removes, a file replacing a directory drops its contents.
func TestOwnerLogLayers(t *testing.T) {
	dir := t.TempDir()
	hdr := func(typ byte, uid, gid int, mode int64) *tar.Header {
		return &tar.Header{Typeflag: typ, Uid: uid, Gid: gid, Mode: mode}
	}
	l := newOwnerLog()
	for _, e := range []struct {
		name string
		hdr  *tar.Header
	}{
		{"/home/user", hdr(tar.TypeDir, 1000, 1000, 0o755)},
		{"/home/user/a", hdr(tar.TypeReg, 1000, 1000, 0o644)},
		{"/home/user/b", hdr(tar.TypeReg, 1000, 1000, 0o644)},
		{"/opt/d", hdr(tar.TypeDir, 7, 7, 0o755)},
		{"/opt/d/x", hdr(tar.TypeReg, 7, 7, 0o644)},
		{"/var/o", hdr(tar.TypeDir, 0, 0, 0o755)},
		{"/var/o/old", hdr(tar.TypeReg, 5, 5, 0o600)},
		{"/usr/bin/s", hdr(tar.TypeReg, 0, 42, 0o2755)},
		{"/gone", hdr(tar.TypeReg, 3, 3, 0o644)},
	} {
		l.record(e.name, e.hdr)
	}
	p1 := filepath.Join(dir, "one"+ownersSuffix)
	if err := l.write(p1); err != nil {
		t.Fatal(err)
	}
	l, err := readOwners(p1)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		name string
		hdr  *tar.Header
	}{
		{"/home/user/a", hdr(tar.TypeReg, 0, 0, 0o644)},       // root's now
		{"/home/user/b", hdr(tar.TypeReg, 1001, 1001, 0o600)}, // another owner
		{"/opt/d", hdr(tar.TypeReg, 8, 8, 0o644)},             // a file replaces the directory
		{"/var/o/.wh..wh..opq", hdr(tar.TypeReg, 0, 0, 0)},
		{"/var/o/new", hdr(tar.TypeReg, 6, 6, 0o644)},
		{"/.wh.gone", hdr(tar.TypeReg, 0, 0, 0)},
		{"/a b\n\"c\"", hdr(tar.TypeReg, 9, 9, 0o644)},
	} {
		l.record(e.name, e.hdr)
	}
	p2 := filepath.Join(dir, "two"+ownersSuffix)
	if err := l.write(p2); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p2)
	if err != nil {
		t.Fatal(err)
	}
	want := `9 9 644 "/a b\n\"c\""
1000 1000 755 "/home/user"
1001 1001 600 "/home/user/b"
8 8 644 "/opt/d"
0 42 2755 "/usr/bin/s"
6 6 644 "/var/o/new"
`
	if string(b) != want {
		t.Fatalf("owners after two layers:\n%s\nwant:\n%s", b, want)
	}
	if _, err := readOwners(p2); err != nil {
		t.Fatal(err)
	}
	// A chain whose files are all root's has no list.
	l = newOwnerLog()
	l.record("/etc/passwd", hdr(tar.TypeReg, 0, 0, 0o644))
	if err := l.write(p2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p2); !os.IsNotExist(err) {
		t.Fatalf("an all-root chain's owners file: %v", err)
	}
}
