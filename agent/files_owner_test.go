package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"hutch.dev/hutch/agent/wire"
)

func TestOwnerFlag(t *testing.T) {
	var o ownerFlag
	if err := o.Set("1000:100"); err != nil || !o.set || o.uid != 1000 || o.gid != 100 || o.String() != "1000:100" {
		t.Fatalf("Set(1000:100): %+v %v", o, err)
	}
	for _, bad := range []string{"", "1000", "a:b", "1:2:3", "-1:0"} {
		var o ownerFlag
		if err := o.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

func TestListDirDepth(t *testing.T) {
	d := t.TempDir()
	for _, p := range []string{"a/b/c/deep", "a/f", "z"} {
		os.MkdirAll(filepath.Join(d, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(d, p), nil, 0o644)
	}
	list := func(depth uint) string {
		var out []wire.FileInfo
		if err := listDir(d, depth, &out); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, fi := range out {
			names = append(names, strings.TrimPrefix(fi.Path, d+"/"))
		}
		return strings.Join(names, " ")
	}
	if got := list(1); got != "a z" {
		t.Errorf("depth 1: %s", got)
	}
	if got := list(2); got != "a a/b a/f z" {
		t.Errorf("depth 2: %s", got)
	}
	if got := list(9); got != "a a/b a/b/c a/b/c/deep a/f z" {
		t.Errorf("depth 9: %s", got)
	}
	var out []wire.FileInfo
	if err := listDir(filepath.Join(d, "z"), 1, &out); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("listing a file: %v, want ENOTDIR", err)
	}
}

func TestMkdirOwned(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "x/y/z")
	if err := mkdirOwned(p, 0o750, ownerFlag{}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		t.Fatalf("%s: %v", p, err)
	}
	if err := mkdirOwned(p, 0o750, ownerFlag{}); err != nil {
		t.Fatalf("an existing directory: %v", err)
	}
	os.WriteFile(filepath.Join(d, "file"), nil, 0o644)
	if err := mkdirOwned(filepath.Join(d, "file"), 0o755, ownerFlag{}); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("over a file: %v, want ENOTDIR", err)
	}
	if os.Geteuid() == 0 {
		q := filepath.Join(d, "owned/sub")
		if err := mkdirOwned(q, 0o755, ownerFlag{set: true, uid: 1234, gid: 5678}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{filepath.Join(d, "owned"), q} {
			fi, _ := os.Stat(p)
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 5678 {
				t.Errorf("%s owned by %d:%d, want 1234:5678", p, st.Uid, st.Gid)
			}
		}
		if fi, _ := os.Stat(d); fi.Sys().(*syscall.Stat_t).Uid == 1234 {
			t.Error("an existing parent was chowned")
		}
	}
}
