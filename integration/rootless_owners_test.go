package integration

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A rootless store unpacks an image as one user's files, root's inside
// the sandbox; the image's own owners still hold inside: the default
// image's user owns its home and writes there, and what a build's RUN
// step made as that user stays the user's, in sandboxes run and created,
// and in a fork.
func TestRootlessImageOwners(t *testing.T) {
	e := newRootlessBuildEnv(t)
	e.extra = append(e.extra, "HUTCH_SHARED_IMAGES=")
	archive := filepath.Join(binDir(t), "images", "bookworm-rootfs.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("%v (run `make base-rootfs`)", err)
	}
	copyFile(t, archive, filepath.Join(e.bin, "images", "bookworm-rootfs.tar"))

	check := `id -un; stat -c %U:%G /home/user; touch /home/user/x && stat -c %U /home/user/x; ` +
		`mkdir -p ~/.local/lib/python3/site-packages && echo pkg > ~/.local/lib/python3/site-packages/p.py && echo local-ok`
	want := "user\nuser:user\nuser\nlocal-ok\n"
	start := time.Now()
	r := e.run(nil, "run", "--rm", "--", "sh", "-c", check)
	if r.code != 0 || r.stdout != want {
		t.Fatalf("rootless run on the default image: want %q: %s", want, r)
	}
	t.Logf("default image built rootless and run in %s", time.Since(start).Round(time.Second))
	// A group's file keeps its group and mode: the user cannot read it.
	if out := e.ok("run", "--rm", "--", "sh", "-c", "stat -c '%U:%G %a' /etc/shadow; cat /etc/shadow >/dev/null 2>&1 || echo denied"); out != "root:shadow 640\ndenied\n" {
		t.Fatalf("/etc/shadow in the default image: %q, want root:shadow 640, unreadable to user", out)
	}

	ctxDir := writeContext(t, map[string]string{
		"Dockerfile": "FROM base\nUSER user\nRUN touch /home/user/built && mkdir /home/user/made\n",
	})
	for _, d := range []string{filepath.Dir(ctxDir), ctxDir} {
		if err := os.Chmod(d, 0o755); err != nil { // the user reads the context
			t.Fatal(err)
		}
	}
	e.ok("image", "build", "-t", "owned", ctxDir)
	built := `stat -c '%U %n' /home/user/built /home/user/made; touch /home/user/made/y && echo made-ok`
	wantBuilt := "user /home/user/built\nuser /home/user/made\nmade-ok\n"
	if out := e.ok("run", "--rm", "--image", "owned", "--", "sh", "-c", built); out != wantBuilt {
		t.Fatalf("hutch run of the built image: %q, want %q", out, wantBuilt)
	}
	// A created sandbox (the init is the agent), then a fork of it.
	id := e.create("--image", "owned")
	defer e.run(nil, "rm", "-f", id)
	if out := e.ok("exec", id, "sh", "-c", built+"; "+check); out != wantBuilt+want {
		t.Fatalf("exec in a created sandbox of the built image: %q, want %q", out, wantBuilt+want)
	}
	forks := strings.Fields(e.ok("fork", id))
	if len(forks) != 1 {
		t.Fatalf("fork printed %q", forks)
	}
	defer e.run(nil, "rm", "-f", forks[0])
	if out := e.ok("exec", forks[0], "sh", "-c", "stat -c %U /home/user/built /home/user/x && touch /home/user/z && echo fork-ok"); out != "user\nuser\nfork-ok\n" {
		t.Fatalf("in a fork: %q", out)
	}
	// A snapshot's layer has the owners as the sandbox saw them.
	e.ok("snapshot", "-t", "ownsnap", id)
	if out := e.ok("run", "--rm", "--image", "ownsnap", "--", "sh", "-c", "stat -c %U /home/user/built /home/user/x && touch /home/user/w && echo snap-ok"); out != "user\nuser\nsnap-ok\n" {
		t.Fatalf("in a sandbox of a snapshot: %q", out)
	}
}

// An image's owners list cannot reach past its own files: an entry on a
// path through a symbolic link, or on another mount (a host directory),
// is left alone, while the image's other entries get their owner and
// mode, setuid included.
func TestRootlessImageOwnersHostile(t *testing.T) {
	e := newRootlessEnv(t)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("a static busybox: %v", err)
	}
	// The layer as a hostile builder would write it: /link is a link to
	// the mount point /mnt/host, and entries under both ask for owners.
	layer := tarOf(t, []tarEntry{
		{hdr: tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, body: bb},
		{hdr: tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}},
		{hdr: tar.Header{Name: "mnt/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{hdr: tar.Header{Name: "mnt/host/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}},
		{hdr: tar.Header{Name: "mnt/host/victim", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1000, Gid: 1000}},
		{hdr: tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "/mnt/host", Uid: 1000, Gid: 1000}},
		{hdr: tar.Header{Name: "link/victim2", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1000, Gid: 1000}},
		{hdr: tar.Header{Name: "owned", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1234, Gid: 4321}},
	})
	img := filepath.Join(filepath.Dir(e.root), "hostile.tar")
	writeOCIArchive(t, img, layer)
	if err := os.Chown(img, int(e.cred.Uid), int(e.cred.Gid)); err != nil {
		t.Fatal(err)
	}
	e.ok("image", "import", "hostile", img)

	host := filepath.Join(filepath.Dir(e.root), "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{host, filepath.Join(host, "victim"), filepath.Join(host, "victim2")} {
		if f != host {
			if err := os.WriteFile(f, []byte("host\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(f, int(e.cred.Uid), int(e.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	script := "stat -c '%u:%g %a %n' /owned /mnt/host /mnt/host/victim /mnt/host/victim2; stat -c '%u:%g %N' /link"
	for _, verb := range [][]string{{"run", "--rm"}, {"create"}} {
		args := append(append([]string{}, verb...), "--image", "hostile", "-v", host+":/mnt/host")
		var out string
		if verb[0] == "run" {
			out = e.ok(append(args, "--", "/bin/sh", "-c", script)...)
		} else {
			id := strings.TrimSpace(e.ok(args...))
			out = e.ok("exec", id, "/bin/sh", "-c", script)
			e.ok("rm", "-f", id)
		}
		want := "1234:4321 4755 /owned\n0:0 755 /mnt/host\n0:0 600 /mnt/host/victim\n0:0 600 /mnt/host/victim2\n" +
			"1000:1000 '/link' -> '/mnt/host'\n"
		if out != want {
			t.Errorf("hutch %s: in the sandbox:\n%s\nwant:\n%s", verb[0], out, want)
		}
		for _, f := range []string{host, filepath.Join(host, "victim"), filepath.Join(host, "victim2")} {
			fi, err := os.Lstat(f)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if st.Uid != e.cred.Uid || st.Gid != e.cred.Gid || (f != host && fi.Mode().Perm() != 0o600) {
				t.Errorf("hutch %s: the host's %s is now %d:%d %v", verb[0], f, st.Uid, st.Gid, fi.Mode())
			}
		}
	}
}

type tarEntry struct {
	hdr  tar.Header
	body []byte
}

func tarOf(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, en := range entries {
		h := en.hdr
		h.Size = int64(len(en.body))
		h.ModTime = time.Unix(1700000000, 0)
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(en.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeOCIArchive writes an OCI image layout tar of one uncompressed
// layer to path.
func writeOCIArchive(t *testing.T, path string, layer []byte) {
	t.Helper()
	blobs := map[string][]byte{}
	add := func(b []byte) (string, int) {
		s := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(s[:])
		blobs[d] = b
		return d, len(b)
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	layerDigest, layerSize := add(layer)
	configDigest, configSize := add(mustJSON(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	}))
	manifestDigest, manifestSize := add(mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	}))
	index := mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifestDigest, "size": manifestSize}},
	})
	entries := []tarEntry{
		{hdr: tar.Header{Name: "oci-layout", Typeflag: tar.TypeReg, Mode: 0o644}, body: []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{hdr: tar.Header{Name: "index.json", Typeflag: tar.TypeReg, Mode: 0o644}, body: index},
	}
	for d, b := range blobs {
		entries = append(entries, tarEntry{hdr: tar.Header{Name: "blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), Typeflag: tar.TypeReg, Mode: 0o644}, body: b})
	}
	if err := os.WriteFile(path, tarOf(t, entries), 0o644); err != nil {
		t.Fatal(err)
	}
}
