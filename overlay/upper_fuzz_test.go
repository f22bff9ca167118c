package overlay

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The upper layer tar is written by the sandbox's sentry: whatever its
// headers say, readUpper yields only clean relative names, no special
// file, and a layer writeLayerTar can write.
func FuzzReadUpper(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "./etc/passwd", Typeflag: tar.TypeReg, Size: 3}},
		{{Name: "./a", Typeflag: tar.TypeChar}, {Name: "./b", Typeflag: tar.TypeLink, Linkname: "./a"}},
		{{Name: "./p", Typeflag: tar.TypeFifo}, {Name: "../../x", Typeflag: tar.TypeReg, Size: 3}},
		{{Name: "./d/", Typeflag: tar.TypeDir, PAXRecords: map[string]string{xattrOpaque: "y"}}},
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
		p := filepath.Join(t.TempDir(), "upper.tar")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		fh, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		entries, err := readUpper(fh, []string{"/run"})
		if err != nil {
			return
		}
		for _, e := range entries {
			n := e.hdr.Name
			if strings.HasPrefix(n, "/") || n == ".." || strings.HasPrefix(n, "../") || strings.Contains(n, "/../") {
				t.Fatalf("entry name %q escapes the layer", n)
			}
			switch e.hdr.Typeflag {
			case tar.TypeFifo, tar.TypeBlock:
				t.Fatalf("special file %q in the layer", n)
			case tar.TypeChar:
				t.Fatalf("device %q in the layer", n)
			}
		}
		writeLayerTar(io.Discard, fh, entries) //nolint:errcheck // truncated data is an error, not a crash
	})
}
