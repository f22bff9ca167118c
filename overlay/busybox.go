package overlay

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BusyboxConfig is the runtime config of the image BusyboxLayer makes.
func BusyboxConfig() ocispec.ImageConfig {
	return ocispec.ImageConfig{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir: "/",
		Cmd:        []string{"/bin/sh"},
	}
}

// BusyboxLayer returns an uncompressed tar of a minimal root filesystem built
// around the statically linked busybox binary at busyboxPath: /bin/busybox, a
// /bin/<applet> symlink for every applet `busybox --list` prints (and
// /usr/bin/env), the usual top-level directories (/tmp sticky and
// world-writable) and /etc/passwd and /etc/group with root and user (uid 1000,
// home /home/user). Entries are owned by root except /home/user and all carry
// the busybox file's modification time, so the same binary always gives the
// same bytes.
func BusyboxLayer(busyboxPath string) ([]byte, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(busyboxPath)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busyboxPath, err)
	}
	applets := map[string]bool{"sh": true}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") && a != "." && a != ".." {
			applets[a] = true
		}
	}
	names := make([]string, 0, len(applets))
	for a := range applets {
		names = append(names, a)
	}
	sort.Strings(names)

	mtime := fi.ModTime().UTC().Truncate(1e9)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, data []byte) error {
		h.ModTime = mtime
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	dir := func(name string, mode int64, uid int) error {
		return add(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, Uid: uid, Gid: uid}, nil)
	}
	for _, d := range []struct {
		name string
		mode int64
		uid  int
	}{
		{"bin", 0o755, 0}, {"dev", 0o755, 0}, {"etc", 0o755, 0}, {"home", 0o755, 0},
		{"home/user", 0o755, 1000}, {"proc", 0o555, 0}, {"root", 0o700, 0}, {"sbin", 0o755, 0},
		{"sys", 0o555, 0}, {"tmp", 0o1777, 0}, {"usr", 0o755, 0}, {"usr/bin", 0o755, 0},
		{"usr/sbin", 0o755, 0}, {"var", 0o755, 0}, {"var/tmp", 0o1777, 0},
	} {
		if err := dir(d.name, d.mode, d.uid); err != nil {
			return nil, err
		}
	}
	if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, bin); err != nil {
		return nil, err
	}
	for _, a := range names {
		if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join("bin", a), Linkname: "busybox", Mode: 0o777}, nil); err != nil {
			return nil, err
		}
	}
	files := []struct{ name, data string }{
		{"etc/group", "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"},
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
	}
	for _, f := range files {
		if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644}, []byte(f.data)); err != nil {
			return nil, err
		}
	}
	if err := add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "usr/bin/env", Linkname: "/bin/busybox", Mode: 0o777}, nil); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
