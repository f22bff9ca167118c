package overlay

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gvisorUpper writes a tar the way gVisor's tmpfs does: "./" names,
// whiteouts as 0/0 character devices, opaque directories as an xattr,
// in the order given. Files hold one "x" per byte.
func gvisorUpper(t *testing.T, hdrs ...*tar.Header) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "upper-")
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, h := range hdrs {
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 5).UTC()
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return f
}

func upperSample() []*tar.Header {
	return []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./etc/group", Typeflag: tar.TypeChar, Devmajor: 0, Devminor: 0},
		{Name: "./etc/shadow", Typeflag: tar.TypeLink, Linkname: "./etc/group"},
		{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o600, Size: 3, Uid: 5, Gid: 6},
		{Name: "./home/", Typeflag: tar.TypeDir, Mode: 0o750, PAXRecords: map[string]string{xattrOpaque: "y", "SCHILY.xattr.user.k": "v"}},
		{Name: "./home/x/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./z/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./z/data", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./a/", Typeflag: tar.TypeDir, Mode: 0o755},
		// A hard link that sorts before the path gVisor wrote data under.
		{Name: "./a/link", Typeflag: tar.TypeLink, Linkname: "./z/data"},
		{Name: "./run/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./run/secrets/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./run/secrets/k", Typeflag: tar.TypeReg, Mode: 0o600, Size: 2},
		{Name: "./.hutch/", Typeflag: tar.TypeDir, Mode: 0o755},
	}
}

func convert(t *testing.T, f *os.File) []byte {
	t.Helper()
	entries, err := readUpper(f, []string{"/run", "/.hutch"})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeLayerTar(&buf, f, entries); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestUpperToLayer(t *testing.T) {
	out := convert(t, gvisorUpper(t, upperSample()...))
	tr := tar.NewReader(bytes.NewReader(out))
	var got []string
	hdrs := map[string]*tar.Header{}
	data := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name)
		hdrs[h.Name] = h
		b, _ := io.ReadAll(tr)
		data[h.Name] = string(b)
	}
	// In the order of gVisor's names (a whiteout where the path it hides
	// is), an opaque directory's marker first in it.
	want := []string{"a/", "a/link", "etc/", "etc/.wh.group", "etc/passwd", "etc/.wh.shadow", "home/", "home/.wh..wh..opq", "home/x/", "z/", "z/data"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("entries\n got %v\nwant %v", got, want)
	}
	if h := hdrs["a/link"]; h.Typeflag != tar.TypeReg || data["a/link"] != "xxxx" {
		t.Errorf("first path of a hard link group must carry the data: %+v %q", h, data["a/link"])
	}
	if h := hdrs["z/data"]; h.Typeflag != tar.TypeLink || h.Linkname != "a/link" {
		t.Errorf("later path must link to the first: %+v", h)
	}
	if h := hdrs["etc/passwd"]; h.Mode != 0o600 || h.Uid != 5 || h.Gid != 6 || data["etc/passwd"] != "xxx" {
		t.Errorf("mode and owner must be kept: %+v %q", h, data["etc/passwd"])
	}
	if h := hdrs["home/"]; h.PAXRecords[xattrOpaque] != "" || h.PAXRecords["SCHILY.xattr.user.k"] != "v" {
		t.Errorf("overlay xattrs must go, user xattrs stay: %v", h.PAXRecords)
	}
}

// The same changes in any order give the same bytes.
func TestUpperDeterministic(t *testing.T) {
	a := upperSample()
	b := upperSample()
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	// gVisor writes the first path of an inode with its data and later
	// ones as links: in reverse, the roles swap.
	for _, h := range b {
		if h.Name == "./a/link" {
			*h = tar.Header{Name: "./z/data", Typeflag: tar.TypeLink, Linkname: "./a/link"}
		} else if h.Name == "./z/data" {
			*h = tar.Header{Name: "./a/link", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4}
		} else if h.Name == "./etc/shadow" {
			*h = tar.Header{Name: "./etc/group", Typeflag: tar.TypeChar}
		} else if h.Name == "./etc/group" {
			*h = tar.Header{Name: "./etc/shadow", Typeflag: tar.TypeLink, Linkname: "./etc/group"}
		}
	}
	x := convert(t, gvisorUpper(t, a...))
	y := convert(t, gvisorUpper(t, b...))
	if !bytes.Equal(x, y) {
		t.Fatal("the same upper layer in another order gives another layer")
	}
}

// upperSampleInOrder is upperSample as runsc with tools/runsc/tarorder.patch
// writes it: every directory's entries in name order, so the first path of
// a hard link group is the one with the data.
func upperSampleInOrder() []*tar.Header {
	return []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./.hutch/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./a/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./a/link", Typeflag: tar.TypeReg, Mode: 0o644, Size: 4},
		{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./etc/group", Typeflag: tar.TypeChar, Devmajor: 0, Devminor: 0},
		{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o600, Size: 3, Uid: 5, Gid: 6},
		{Name: "./etc/shadow", Typeflag: tar.TypeLink, Linkname: "./etc/group"},
		{Name: "./home/", Typeflag: tar.TypeDir, Mode: 0o750, PAXRecords: map[string]string{xattrOpaque: "y", "SCHILY.xattr.user.k": "v"}},
		{Name: "./home/x/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./run/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./run/secrets/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./run/secrets/k", Typeflag: tar.TypeReg, Mode: 0o600, Size: 2},
		{Name: "./z/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./z/data", Typeflag: tar.TypeLink, Linkname: "./a/link"},
	}
}

// streamConvert converts f as streamLayerTar does.
func streamConvert(f *os.File, exclude []string) ([]byte, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	err := streamLayerTar(&buf, f, exclude, nil)
	return buf.Bytes(), err
}

// An upper layer in name order, converted as it streams, gives the bytes
// the sorted conversion gives from any order; one out of order is refused.
func TestUpperStream(t *testing.T) {
	exclude := []string{"/run", "/.hutch"}
	want := convert(t, gvisorUpper(t, upperSample()...))
	got, err := streamConvert(gvisorUpper(t, upperSampleInOrder()...), exclude)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the streamed layer differs from the sorted one")
	}
	if sorted := convert(t, gvisorUpper(t, upperSampleInOrder()...)); !bytes.Equal(sorted, want) {
		t.Fatal("the sorted layer of the ordered upper differs")
	}

	for name, hdrs := range map[string][]*tar.Header{
		"map order": upperSample(),
		"a directory's entry after a later name": {
			{Name: "./a/", Typeflag: tar.TypeDir}, {Name: "./a.txt", Typeflag: tar.TypeReg}, {Name: "./a/x", Typeflag: tar.TypeReg},
		},
		"a name twice":                    {{Name: "./a", Typeflag: tar.TypeReg}, {Name: "./a", Typeflag: tar.TypeReg}},
		"children before their directory": {{Name: "./b/x", Typeflag: tar.TypeReg}, {Name: "./b/", Typeflag: tar.TypeDir}},
	} {
		if _, err := streamConvert(gvisorUpper(t, hdrs...), nil); !errors.Is(err, ErrUnordered) {
			t.Errorf("%s: %v, want ErrUnordered", name, err)
		}
	}
	// Name order is per directory: "a/x" before "a.txt" and "a-b".
	ordered := []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir}, {Name: "./a/", Typeflag: tar.TypeDir}, {Name: "./a/x", Typeflag: tar.TypeReg, Size: 1},
		{Name: "./a-b", Typeflag: tar.TypeReg, Size: 2}, {Name: "./a.txt", Typeflag: tar.TypeReg, Size: 3},
	}
	got, err = streamConvert(gvisorUpper(t, ordered...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := convert(t, gvisorUpper(t, ordered[4], ordered[2], ordered[0], ordered[3], ordered[1])); !bytes.Equal(got, want) {
		t.Fatal("streamed and sorted layers differ")
	}

	// A header check's error stops the stream before the file's header
	// and data.
	var seen []string
	f := gvisorUpper(t, upperSampleInOrder()...)
	f.Seek(0, io.SeekStart)
	stop := errors.New("stop")
	var out bytes.Buffer
	err = streamLayerTar(&out, f, exclude, func(h *tar.Header) error {
		seen = append(seen, h.Name)
		if h.Name == "./etc/passwd" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || seen[len(seen)-1] != "./etc/passwd" || bytes.Contains(out.Bytes(), []byte("etc/passwd")) {
		t.Fatalf("check: %v after %v", err, seen)
	}
}

// A hard link whose data gVisor wrote under a path snapshots leave out is
// left out too, whichever way the layer is converted.
func TestUpperLinkToExcluded(t *testing.T) {
	hdrs := []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir},
		{Name: "./root/", Typeflag: tar.TypeDir},
		{Name: "./root/keep", Typeflag: tar.TypeReg, Size: 1},
		{Name: "./run/", Typeflag: tar.TypeDir},
		{Name: "./run/secret", Typeflag: tar.TypeReg, Size: 6},
		{Name: "./z", Typeflag: tar.TypeLink, Linkname: "./run/secret"},
	}
	exclude := []string{"/run"}
	f := gvisorUpper(t, hdrs...)
	entries, err := readUpper(f, exclude)
	if err != nil {
		t.Fatal(err)
	}
	var sorted bytes.Buffer
	if err := writeLayerTar(&sorted, f, entries); err != nil {
		t.Fatal(err)
	}
	streamed, err := streamConvert(f, exclude)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(streamed, sorted.Bytes()) {
		t.Fatal("streamed and sorted layers differ")
	}
	tr := tar.NewReader(bytes.NewReader(streamed))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, " ") != "root/ root/keep" {
		t.Fatalf("layer holds %v", names)
	}
}

// A snapshot applied on its parent shows the changes, deletions included.
func TestSnapshotOnParent(t *testing.T) {
	requiresRoot(t)
	ctx := context.Background()
	s := newStore(t)
	base := makeTar(t, dir("etc/"), file("etc/group", "g"), file("etc/passwd", "p"),
		dir("home/"), file("home/old", "o"), dir("z/"))
	ar, _ := simpleArchive(t, layer{tar: base, compression: "gzip"})
	parent := importBytes(t, s, "base", ar)
	img, err := s.Snapshot(ctx, SnapshotOptions{Name: "snap", Parent: parent, Upper: gvisorUpper(t, upperSample()...), Exclude: []string{"/run", "/.hutch"}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Snapshot(ctx, SnapshotOptions{Name: "snap2", Parent: parent, Upper: gvisorUpper(t, upperSample()...), Exclude: []string{"/run", "/.hutch"}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != img.Digest {
		t.Fatal("identical changes gave different images")
	}
	p, err := s.Rootfs(ctx, img, "t")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".", "a", "a/link", "etc", "etc/passwd", "home", "home/x", "z", "z/data"}
	if got := listTree(t, p); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("tree\n got %v\nwant %v", got, want)
	}
	if fi, _ := os.Stat(filepath.Join(p, "etc/passwd")); fi.Mode().Perm() != 0o600 || ownerOf(t, filepath.Join(p, "etc/passwd")) != 5 {
		t.Fatalf("etc/passwd: mode %v owner %d", fi.Mode(), ownerOf(t, filepath.Join(p, "etc/passwd")))
	}
}

func TestCheckpointStore(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	ci, err := s.NewCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ci.Dir(), "checkpoint.img"), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(ci.Dir(), "pages.img"), bytes.Repeat([]byte("p"), 1<<20), 0o600)
	ck, err := ci.Commit(ctx, map[string]string{"sandbox": "x"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.OpenCheckpoint(ctx, ck.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if got.Size() != 5+1<<20 || readFile(t, filepath.Join(got.Dir, "checkpoint.img")) != "state" {
		t.Fatalf("checkpoint: %+v", got)
	}

	// An abandoned ingest is invisible and pruned.
	ci2, _ := s.NewCheckpoint(ctx)
	os.WriteFile(filepath.Join(ci2.Dir(), "pages.img"), []byte("partial"), 0o600)
	ci2.gc.Unlock() // as if its process had died
	if all, _ := s.Checkpoints(ctx); len(all) != 1 {
		t.Fatalf("checkpoints: %+v", all)
	}
	if _, err := s.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.checkpointsDir()); len(ents) != 1 {
		t.Fatalf("prune left %v", ents)
	}

	// One flipped byte, or a truncated file, is refused.
	pages := filepath.Join(got.Dir, "pages.img")
	f, _ := os.OpenFile(pages, os.O_RDWR, 0)
	f.WriteAt([]byte("q"), 4096)
	f.Close()
	if _, err := s.OpenCheckpoint(ctx, ck.Digest); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pages.img") {
		t.Fatalf("flipped byte: %v", err)
	}
	os.Truncate(pages, 100)
	if _, err := s.OpenCheckpoint(ctx, ck.Digest); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated: %v", err)
	}
	if err := s.RemoveCheckpoint(ctx, ck.Digest); err != nil {
		t.Fatal(err)
	}
	if all, _ := s.Checkpoints(ctx); len(all) != 0 {
		t.Fatalf("after remove: %+v", all)
	}
}

// FIFOs and device nodes made in a sandbox, and hard links to them, never
// enter a snapshot layer; whiteouts (char 0:0) still do.
func TestUpperDropsSpecialFiles(t *testing.T) {
	out := convert(t, gvisorUpper(t,
		&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		&tar.Header{Name: "./etc/passwd", Typeflag: tar.TypeFifo, Mode: 0o644},
		&tar.Header{Name: "./etc/passwd2", Typeflag: tar.TypeLink, Linkname: "./etc/passwd"},
		&tar.Header{Name: "./etc/group", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
		&tar.Header{Name: "./etc/disk", Typeflag: tar.TypeBlock, Devmajor: 8, Devminor: 0, Mode: 0o660},
		&tar.Header{Name: "./etc/gone", Typeflag: tar.TypeChar},
		&tar.Header{Name: "./etc/hosts", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2},
	))
	tr := tar.NewReader(bytes.NewReader(out))
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %c", h.Name, h.Typeflag))
	}
	want := "etc/ 5,etc/.wh.gone 0,etc/hosts 0"
	if strings.Join(got, ",") != want {
		t.Fatalf("layer holds %q, want %q", strings.Join(got, ","), want)
	}
}
