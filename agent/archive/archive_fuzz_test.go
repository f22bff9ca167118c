package archive

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Extract reads tar streams that come out of a sandbox: whatever the
// headers say, nothing is written outside the destination, and nothing
// but regular files, directories, symlinks and FIFOs is made (never a
// device node).
func FuzzExtract(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "a/f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"}, {Name: "l/passwd", Typeflag: tar.TypeReg, Size: 3}},
		{{Name: "../x", Typeflag: tar.TypeReg, Size: 3}},
		{{Name: "/abs", Typeflag: tar.TypeReg, Size: 3}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}},
		{{Name: "p", Typeflag: tar.TypeFifo}, {Name: "d", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		{{Name: "s", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 3}},
	} {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			tw.WriteHeader(&h)
			if h.Size > 0 {
				tw.Write([]byte("abc"))
			}
		}
		tw.Close()
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "dst")
		if err := os.Mkdir(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		Extract(bytes.NewReader(b), dst, ExtractOptions{NoSetID: true}) //nolint:errcheck // any outcome but an escape is fine
		err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != base && p != dst && !strings.HasPrefix(p, dst+"/") {
				t.Errorf("extract wrote %s outside %s", p, dst)
			}
			switch d.Type() {
			case 0, fs.ModeDir, fs.ModeSymlink, fs.ModeNamedPipe:
			default:
				t.Errorf("extract made %s of type %v", p, d.Type())
			}
			if fi, err := d.Info(); err == nil && fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Errorf("extract kept a set-ID bit on %s", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
