package integration

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// plantSetID is what root inside a sandbox does to a read-write mount at
// /m to leave a host user a way to root: a copy of the host's own id(1)
// (mounted read-only at /src) made setuid and setgid in every way there
// is, a setgid directory, and a file given to another owner.
const plantSetID = `set -u
cp /src/id /m/p && chmod 4755 /m/p && chmod g+s /m/p
cp /src/id /m/g && chmod 2755 /m/g
cp /src/id /m/n && chmod u+s,g+s /m/n
mkdir /m/d && chmod 2777 /m/d
mkdir -m 6777 /m/e
cp /src/id /m/d/p && chmod 6755 /m/d/p
touch /m/q; chown 1234:1234 /m/q 2>/dev/null && echo chown-ok
echo planted`

// mountDir makes a host directory owned by owner that every local user
// can reach, with a read-only source directory beside it holding id(1).
func mountDir(t *testing.T, owner *syscall.Credential) (dir, src string) {
	t.Helper()
	base, err := os.MkdirTemp("", "hutch-mount-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir, src = filepath.Join(base, "m"), filepath.Join(base, "src")
	for _, d := range []string{base, dir, src} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
		t.Fatal(err)
	}
	copyFile(t, "/usr/bin/id", filepath.Join(src, "id"))
	if err := os.Chmod(filepath.Join(src, "id"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, src
}

// checkNoSetID fails unless every file under dir lacks set-ID bits and
// belongs to owner (when owner is not nil), and unless running dir's
// planted programs as nobody leaves nobody's euid and egid (with run:
// where nobody can reach them).
func checkNoSetID(t *testing.T, dir string, owner *syscall.Credential, run bool) {
	t.Helper()
	n := 0
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		n++
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s on the host is %v: a set-ID bit from inside the sandbox", p, fi.Mode())
		}
		st := fi.Sys().(*syscall.Stat_t)
		if owner != nil && p != dir && (st.Uid != owner.Uid || st.Gid != owner.Gid) {
			t.Errorf("%s on the host belongs to %d:%d, want the mount's owner %d:%d", p, st.Uid, st.Gid, owner.Uid, owner.Gid)
		}
		return nil
	})
	if n < 8 {
		t.Fatalf("only %d files under %s: the planting did not run", n, dir)
	}
	if !run {
		return
	}
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	for _, prog := range []string{"p", "g", "n", "d/p"} {
		c := exec.Command(filepath.Join(dir, prog))
		c.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		out, err := c.CombinedOutput()
		if err != nil {
			t.Errorf("%s run as nobody: %v: %s", prog, err, out)
			continue
		}
		if strings.Contains(string(out), "euid=") || strings.Contains(string(out), "egid=") || !strings.HasPrefix(string(out), "uid=65534(") {
			t.Errorf("%s run as nobody: %q, want nobody's own IDs only", prog, out)
		}
	}
}

// Root inside a sandbox cannot leave a setuid or setgid file, or a file of
// another owner, in a read-write host directory: what it writes there has
// no set-ID bit and belongs to the directory's owner, so a local user who
// runs it stays who they are.
func TestHostileHostMountSetID(t *testing.T) {
	e := newEnv(t)
	cred := plantInUsersDir(t, e, testUser(t, "hutchmount"))

	// The same in a created sandbox, by exec, and in one whose mount is
	// root's: what root writes there stays root's, still without set-ID.
	rootDir, src2 := mountDir(t, &syscall.Credential{Uid: 0, Gid: 0})
	id := e.create("-v", rootDir+":/m", "-v", src2+":/src:ro")
	e.ok("exec", id, "--", "sh", "-c", plantSetID)
	checkNoSetID(t, rootDir, &syscall.Credential{Uid: 0, Gid: 0}, false)
	// The sandbox holds its files open; once it is gone, they run.
	e.ok("rm", "-f", id)
	checkNoSetID(t, rootDir, &syscall.Credential{Uid: 0, Gid: 0}, true)

	// A named volume, whose files the sandboxes sharing it own as they
	// choose: still no set-ID bit reaches the host.
	e.ok("volume", "create", "planted")
	vdir := filepath.Join(e.root, "volumes", "planted", "data")
	out := e.ok("run", "--rm", "--image", "busybox", "-v", "planted:/m", "-v", src2+":/src:ro", "--", "sh", "-c", plantSetID)
	if !strings.Contains(out, "planted") {
		t.Fatalf("planting in a volume: %q", out)
	}
	checkNoSetID(t, vdir, nil, false)

	// An :overlay workspace takes the writes in its own layer, and applying
	// them copies them to the host directory: neither holds a set-ID bit.
	wsDir, src3 := mountDir(t, cred)
	ws := e.create("-v", wsDir+":/m:overlay", "-v", src3+":/src:ro")
	e.ok("exec", ws, "--", "sh", "-c", plantSetID)
	checkNoSetID(t, filepath.Join(e.root, "sandboxes", ws, "workspaces", "0", "upper"), nil, false)
	e.ok("diff", "--apply", ws)
	e.ok("rm", "-f", ws)
	checkNoSetID(t, wsDir, cred, true)
}

// The same holds when an unprivileged user runs hutch: the files root
// inside the sandbox writes to the user's directory are the user's, with
// no set-ID bit another local user could run.
func TestHostileHostMountSetIDRootless(t *testing.T) {
	plantInUsersDir(t, newRootlessEnv(t), rootlessUser(t))
}

// plantInUsersDir runs plantSetID as root inside a sandbox of e on a
// directory of u's, checks what it left there, and returns u's IDs.
func plantInUsersDir(t *testing.T, e *env, u *user.User) *syscall.Credential {
	t.Helper()
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	dir, src := mountDir(t, cred)
	out := e.ok("run", "--rm", "--image", "busybox", "-v", dir+":/m", "-v", src+":/src:ro", "--", "sh", "-c", plantSetID)
	if strings.Contains(out, "chown-ok") || !strings.Contains(out, "planted") {
		t.Fatalf("planting: %q (a chown to another owner must be refused)", out)
	}
	checkNoSetID(t, dir, cred, true)
	return cred
}
