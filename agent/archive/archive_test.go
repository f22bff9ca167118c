package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type entry struct {
	name, link string
	typ        byte
	mode       int64
	data       string
}

func tarOf(t *testing.T, es ...entry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.data)), ModTime: time.Unix(1e9, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// Archives a hostile sandbox could send: none of them may write outside
// the destination.
func TestExtractRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		es   func(victim string) []entry
	}{
		{"dotdot", func(string) []entry { return []entry{{name: "../escaped", typ: tar.TypeReg, data: "x"}} }},
		{"nested dotdot", func(string) []entry { return []entry{{name: "a/../../escaped", typ: tar.TypeReg, data: "x"}} }},
		{"absolute", func(string) []entry { return []entry{{name: "/escaped", typ: tar.TypeReg, data: "x"}} }},
		{"through its own symlink", func(v string) []entry {
			return []entry{
				{name: "l", typ: tar.TypeSymlink, link: v},
				{name: "l/escaped", typ: tar.TypeReg, data: "x"},
			}
		}},
		{"through a relative symlink", func(string) []entry {
			return []entry{
				{name: "d/", typ: tar.TypeDir, mode: 0o755},
				{name: "d/l", typ: tar.TypeSymlink, link: "../../../victim"},
				{name: "d/l/escaped", typ: tar.TypeReg, data: "x"},
			}
		}},
		{"directory over a symlink", func(v string) []entry {
			return []entry{
				{name: "l", typ: tar.TypeSymlink, link: v},
				{name: "l/", typ: tar.TypeDir, mode: 0o755},
				{name: "l/escaped", typ: tar.TypeReg, data: "x"},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			victim := filepath.Join(base, "victim")
			dst := filepath.Join(base, "dst", "inner")
			if err := os.MkdirAll(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			err := Extract(tarOf(t, tc.es(victim)...), dst, ExtractOptions{})
			if !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("want ErrUnsafePath, got %v", err)
			}
			for _, p := range []string{filepath.Join(victim, "escaped"), filepath.Join(base, "escaped"), filepath.Join(base, "dst", "escaped")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s was written", p)
				}
			}
		})
	}
}

// A file entry replaces a symlink at its name instead of writing through
// it; set-ID bits are dropped on request; mode and mtime are kept.
func TestExtractReplacesSymlinkAndDropsSetID(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dst, "f")); err != nil {
		t.Fatal(err)
	}
	err := Extract(tarOf(t, entry{name: "f", typ: tar.TypeReg, data: "new", mode: 0o4755}), dst, ExtractOptions{NoSetID: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "safe" {
		t.Fatalf("victim written through a symlink: %q", b)
	}
	fi, err := os.Lstat(filepath.Join(dst, "f"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("f: %v %v", fi.Mode(), err)
	}
	if !fi.ModTime().Equal(time.Unix(1e9, 0)) {
		t.Fatalf("mtime %v", fi.ModTime())
	}
}

// "DIR/." archives the contents under ".", which a rename turns into the
// destination's name.
func TestContentsCopyRenamed(t *testing.T) {
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteTar(&b, src+"/.", ArchiveName(src+"/.")); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := Extract(&b, dst, ExtractOptions{Rename: "copy"}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "copy", "f")); err != nil || string(got) != "x" {
		t.Fatalf("copy/f: %q %v", got, err)
	}
}

func TestArchiveNameAndCopyTarget(t *testing.T) {
	for src, want := range map[string]string{"/a/b": "b", "/a/b/": "b", "/a/b/.": ".", ".": ".", "f": "f"} {
		if got := ArchiveName(src); got != want {
			t.Errorf("ArchiveName(%q) = %q, want %q", src, got, want)
		}
	}
	d := t.TempDir()
	if dir, rn, err := CopyTarget(d); err != nil || dir != d || rn != "" {
		t.Errorf("existing dir: %q %q %v", dir, rn, err)
	}
	if dir, rn, err := CopyTarget(filepath.Join(d, "new")); err != nil || dir != d+"/" || rn != "new" {
		t.Errorf("new name: %q %q %v", dir, rn, err)
	}
	if _, _, err := CopyTarget(filepath.Join(d, "no", "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing parent: %v", err)
	}
}
