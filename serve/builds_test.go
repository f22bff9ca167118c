package serve

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tarOf is a tar of entries: a name ending in / is a directory, "->"
// makes a symlink, anything else a file with that content.
func tarOf(t *testing.T, gz bool, entries ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w *tar.Writer
	var z *gzip.Writer
	if gz {
		z = gzip.NewWriter(&buf)
		w = tar.NewWriter(z)
	} else {
		w = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, strings.TrimPrefix(e[1], "->"), 0
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			w.Write([]byte(e[1]))
		}
	}
	w.Close()
	if z != nil {
		z.Close()
	}
	return buf.Bytes()
}

func uploadFor(t *testing.T, s *Server, tenantName, hash string, b []byte) {
	t.Helper()
	dir := s.buildFilesDir(tenantName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, hash+".tar"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// An upload unpacks inside the build's context and nowhere else: a name
// with "..", an absolute name, and a file written through a symlink to
// outside are refused, and nothing lands outside.
func TestExtractUploadStaysInside(t *testing.T) {
	s := &Server{cfg: Config{StateDir: t.TempDir()}}
	outside := t.TempDir()
	hash := strings.Repeat("a", 64)
	uploadFor(t, s, "t1", hash, tarOf(t, true, [2]string{"app/", ""}, [2]string{"app/main.py", "print(1)\n"}, [2]string{"app/link", "->/etc/passwd"}))
	ctx := filepath.Join(t.TempDir(), "files")
	if err := s.extractUpload("t1", hash, ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(ctx, "app", "main.py")); err != nil || string(b) != "print(1)\n" {
		t.Fatalf("app/main.py: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(ctx, "app", "link")); err != nil || l != "/etc/passwd" {
		t.Fatalf("app/link: %q %v, want the symlink kept as it is", l, err)
	}
	for name, entries := range map[string][][2]string{
		"dot-dot":       {{"../escape.txt", "x"}},
		"nested dotdot": {{"a/../../escape.txt", "x"}},
		"absolute":      {{outside + "/escape.txt", "x"}},
		"through a link": {
			{"out", "->" + outside},
			{"out/escape.txt", "x"},
		},
	} {
		h := strings.Repeat("b", 63) + string(rune('0'+len(name)%10))
		uploadFor(t, s, "t1", h, tarOf(t, false, entries...))
		if err := s.extractUpload("t1", h, filepath.Join(t.TempDir(), "files")); err == nil {
			t.Errorf("%s: unpacked, want refused", name)
		}
		if _, err := os.Stat(filepath.Join(outside, "escape.txt")); err == nil {
			t.Fatalf("%s: wrote outside the context", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(filepath.Join(t.TempDir(), "files")), "escape.txt")); err == nil {
			t.Fatalf("%s: wrote beside the context", name)
		}
	}
	// Another tenant's upload of the same hash is not this tenant's.
	if err := s.extractUpload("t2", hash, filepath.Join(t.TempDir(), "files")); err == nil || !strings.Contains(err.Error(), "were not uploaded") {
		t.Errorf("tenant t2 using t1's upload: %v", err)
	}
}

// Steps become a Dockerfile of their exec forms; a step of another type,
// a bad user or an ENV value with a line break answers as bad input.
func TestWriteContext(t *testing.T) {
	s := &Server{cfg: Config{StateDir: t.TempDir()}}
	hash := strings.Repeat("c", 64)
	uploadFor(t, s, "t1", hash, tarOf(t, true, [2]string{"hello.txt", "hi\n"}))
	dir := t.TempDir()
	steps, err := s.writeContext(dir, "t1", "base:latest", "user", buildStart{Steps: []templateStep{
		{Type: "COPY", Args: []string{"hello.txt", "/home/user/", "user", "0644"}, FilesHash: hash},
		{Type: "RUN", Args: []string{"echo \"$HOME\" && id", "root"}},
		{Type: "ENV", Args: []string{"A", "x y", "B", `q"uote`}},
		{Type: "WORKDIR", Args: []string{"/srv"}},
		{Type: "USER", Args: []string{"1000:1000"}},
		{Type: "RUN", Args: []string{"true"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	df, _ := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	want := `FROM base:latest
COPY --chown=user --chmod=0644 ["files/` + hash + `/hello.txt", "/home/user/"]
USER root
RUN ["/bin/sh", "-c", "echo \"$HOME\" && id"]
USER user
ENV A="x y" B="q\"uote"
WORKDIR /srv
USER 1000:1000
RUN ["/bin/sh", "-c", "true"]
`
	if string(df) != want {
		t.Errorf("Dockerfile:\n%s\nwant:\n%s", df, want)
	}
	if got := strings.Join(steps, " "); got != "base 1 2 2 2 3 4 5 6 finalize" {
		t.Errorf("steps %q", got)
	}
	for _, st := range []templateStep{
		{Type: "ADD", Args: []string{"http://x", "/"}},
		{Type: "RUN", Args: []string{"true", "root; rm -rf /"}},
		{Type: "ENV", Args: []string{"A", "line\nbreak"}},
		{Type: "ENV", Args: []string{"1A", "x"}},
		{Type: "COPY", Args: []string{"../x", "/"}, FilesHash: hash},
		{Type: "COPY", Args: []string{"hello.txt", "/"}, FilesHash: strings.Repeat("d", 64)},
	} {
		if _, err := s.writeContext(t.TempDir(), "t1", "base", "user", buildStart{Steps: []templateStep{st}}); err == nil || httpStatus(err) != 400 {
			t.Errorf("step %+v: %v, want a 400", st, err)
		}
	}
}
