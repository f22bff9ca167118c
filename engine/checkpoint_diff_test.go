package engine

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func layerOf(t *testing.T, es ...tarEntry) *stateLayer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	l, err := readStateLayer(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func lines(chs []CheckpointChange) string {
	var b strings.Builder
	for _, c := range chs {
		b.WriteString(c.Kind + " ")
		if c.From != "" {
			b.WriteString(c.From + " -> ")
		}
		b.WriteString(c.Path)
		if c.OldMode != 0 && c.OldMode != c.Mode {
			b.WriteString(" " + c.OldMode.Perm().String() + ">" + c.Mode.Perm().String())
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestDiffStates(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "home/user/sub"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "etc/group"), []byte("wheel\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "home/user/sub/f"), []byte("f\n"), 0o644))
	must(os.Symlink("/etc", filepath.Join(dir, "lnk")))
	base, err := openBase(dir)
	must(err)
	defer base.close()

	a := layerOf(t,
		tarEntry{name: "root/", typ: tar.TypeDir, mode: 0o700},
		tarEntry{name: "root/keep", body: "same"},
		tarEntry{name: "root/change", body: "one"},
		tarEntry{name: "root/gone", body: "bye"},
		tarEntry{name: "root/old-name", body: "moved content"},
		tarEntry{name: "root/perm", body: "p", mode: 0o644},
	)
	b := layerOf(t,
		tarEntry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: "etc/.wh.group"},
		tarEntry{name: "etc/passwd", body: "root\n", mode: 0o600},
		tarEntry{name: "home/.wh.user"},
		tarEntry{name: "root/", typ: tar.TypeDir, mode: 0o700},
		tarEntry{name: "root/keep", body: "same"},
		tarEntry{name: "root/change", body: "two"},
		tarEntry{name: "root/new-name", body: "moved content"},
		tarEntry{name: "root/new", body: "new"},
		tarEntry{name: "root/perm", body: "p", mode: 0o755},
		tarEntry{name: "root/ln", typ: tar.TypeSymlink, link: "/root/new"},
		tarEntry{name: "lnk/x", body: "not through the image's symlink"},
	)
	chs, err := diffStates(a, b, base)
	must(err)
	want := `D /etc/group
M /etc/passwd -rw-r--r-->-rw-------
D /home/user
D /home/user/sub
D /home/user/sub/f
A /lnk/x
M /root/change
D /root/gone
A /root/ln
A /root/new
R /root/old-name -> /root/new-name
M /root/perm -rw-r--r-->-rwxr-xr-x
`
	if got := lines(chs); got != want {
		t.Fatalf("diff:\n%s\nwant:\n%s", got, want)
	}
	// The other way round.
	chs, err = diffStates(b, a, base)
	must(err)
	if got := lines(chs); !strings.Contains(got, "A /etc/group\n") || !strings.Contains(got, "R /root/new-name -> /root/old-name\n") || !strings.Contains(got, "A /home/user/sub/f\n") {
		t.Fatalf("reverse diff:\n%s", got)
	}
	// Against itself: nothing.
	chs, err = diffStates(b, b, base)
	must(err)
	if len(chs) != 0 {
		t.Fatalf("a state against itself:\n%s", lines(chs))
	}
}

func TestValidCheckpointID(t *testing.T) {
	for _, id := range []string{"ck-0123456789ab"} {
		if err := ValidCheckpointID(id); err != nil {
			t.Errorf("%q: %v", id, err)
		}
	}
	for _, id := range []string{"", "ck-", "../../etc/passwd", "ck-0123456789aB", "ck-0123456789abc", "ck-/123456789ab", "xx-0123456789ab", "ck-0123456789a\x00"} {
		if err := ValidCheckpointID(id); err == nil {
			t.Errorf("%q accepted", id)
		}
	}
}
