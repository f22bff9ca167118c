package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// namedRootlessEnv runs hutch as the unprivileged user name (created if
// needed, as the test user is) with the binaries of e and a state root
// of its own under a fresh XDG_DATA_HOME.
func namedRootlessEnv(t *testing.T, e *env, name string) *env {
	t.Helper()
	return userEnv(t, testUser(t, name), e.bin)
}

// Two unprivileged users on one host: neither sees nor touches the
// other's sandboxes, images or state, through hutch or around it. User A
// keeps a sandbox running with a secret in it and a port published on a
// UNIX socket; user B, knowing its ID and name, tries every hutch verb on
// it, hutch pointed at A's state root and image store, runsc pointed at
// A's runsc root, A's files and sockets directly, and A's processes
// through /proc and signals. A's sandbox runs on, untouched, throughout.
func TestRootlessTwoUsers(t *testing.T) {
	a := newRootlessEnv(t)
	if _, err := os.Stat(filepath.Join(binDir(t), "hutch-helper")); err == nil {
		copyFile(t, filepath.Join(binDir(t), "hutch-helper"), filepath.Join(a.bin, "hutch-helper"))
	}
	b := namedRootlessEnv(t, a, "hutchtest2")
	if a.cred.Uid == b.cred.Uid {
		t.Fatal("the two test users have the same UID")
	}
	// A's data directory open to all, as many home directories are:
	// only the modes hutch gives its own state keep B out. A's temporary
	// files go where everyone's do.
	aData := filepath.Dir(a.root)
	if err := os.Chmod(aData, 0o755); err != nil {
		t.Fatal(err)
	}
	a.extra = append(a.extra, "HUTCH_SHARED_IMAGES=", "TMPDIR=")
	b.extra = append(b.extra, "HUTCH_SHARED_IMAGES=")
	started := time.Now()

	tar := filepath.Join(a.bin, "images", "busybox.tar")
	a.ok("image", "import", "a-private", tar)
	sock := filepath.Join(aData, "port.sock")
	id := a.create("--image", "a-private", "--name", "alpha", "-p", "unix:"+sock+":8080")
	a.ok("exec", id, "--", "sh", "-c", "mkdir -p /www && echo a-secret > /www/index.html && echo a-secret > /root/secret")
	a.ok("exec", "-d", id, "--", "httpd", "-f", "-p", "8080", "-h", "/www")
	fetch := "curl -sS --max-time 10 --unix-socket " + sock + " http://x/"
	waitFor(t, func() bool {
		out, ok := userShell(a, fetch)
		return ok && out == "a-secret\n"
	})
	before := a.inspect(id)
	var procs []int
	for _, p := range processesMentioning(id) {
		pid, _ := strconv.Atoi(strings.TrimSuffix(strings.Fields(p)[1], ":"))
		if procUID(strconv.Itoa(pid)) == strconv.Itoa(int(a.cred.Uid)) {
			procs = append(procs, pid)
		}
	}
	if len(procs) < 3 { // runsc's gofer and sandbox, the forwarder
		t.Fatalf("A's sandbox runs %d processes as A: %v", len(procs), processesMentioning(id))
	}

	// hutch run by B knows nothing of A's sandbox or images.
	b.ok("image", "import", "busybox", tar)
	if ls := b.list(); len(ls) != 0 {
		t.Fatalf("B's ls lists A's sandboxes: %+v", ls)
	}
	if out := b.ok("image", "ls"); strings.Contains(out, "a-private") {
		t.Fatalf("B's image ls lists A's image:\n%s", out)
	}
	hostFile := filepath.Join(filepath.Dir(b.root), "f")
	if err := os.WriteFile(hostFile, []byte("from B\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{id, id[:12], "alpha"} {
		for _, args := range [][]string{
			{"exec", ref, "--", "cat", "/root/secret"},
			{"inspect", ref},
			{"cp", ref + ":/root/secret", filepath.Join(filepath.Dir(b.root), "got")},
			{"cp", hostFile, ref + ":/root/secret"},
			{"logs", ref},
			{"stats", ref},
			{"ps", ref},
			{"update", ref, "--net", "none"},
			{"pause", ref},
			{"fork", ref},
			{"snapshot", "-t", "stolen", ref},
			{"stop", ref},
			{"rm", "-f", ref},
		} {
			r := b.run(nil, args...)
			if r.code == 0 || strings.Contains(r.stdout, "a-secret") {
				t.Errorf("B's hutch %s: %s", strings.Join(args, " "), r)
			}
		}
	}
	r := b.run(nil, "create", "--image", "a-private")
	if r.code == 0 {
		t.Errorf("B runs a sandbox on A's image: %s", r)
	}
	// Names are each user's own.
	bid := b.create("--name", "alpha")
	if ls := b.list(); len(ls) != 1 || ls[0].ID != bid {
		t.Fatalf("B's ls: %+v", ls)
	}
	if ls := a.list(); len(ls) != 1 || ls[0].ID != id {
		t.Fatalf("A's ls: %+v", ls)
	}

	// hutch pointed at A's state root refuses it; pointed at A's image
	// store as a shared one, it cannot read it.
	o := *b
	o.extra = append(append([]string{}, b.extra...), "HUTCH_ROOT="+a.root)
	for _, args := range [][]string{{"ls", "-q"}, {"exec", id, "--", "cat", "/root/secret"}, {"rm", "-f", id}, {"run", "--rm", "--image", "a-private", "--", "true"}} {
		if r := o.run(nil, args...); r.code == 0 || strings.Contains(r.stdout, id) || strings.Contains(r.stdout, "a-secret") {
			t.Errorf("B's hutch %s with A's state root: %s", strings.Join(args, " "), r)
		}
	}
	o.extra = append(append([]string{}, b.extra...), "HUTCH_SHARED_IMAGES="+filepath.Join(a.root, "images"))
	if r := o.run(nil, "run", "--rm", "--image", "a-private", "--", "true"); r.code == 0 {
		t.Errorf("B runs a sandbox on A's image through HUTCH_SHARED_IMAGES: %s", r)
	}

	// A's state is A's alone: owner-only directories all the way down to
	// every sandbox's, the runsc root and the image store.
	for _, d := range []string{
		a.root, filepath.Join(a.root, "sandboxes"), filepath.Join(a.root, "sandboxes", id),
		filepath.Join(a.root, "runsc"), filepath.Join(a.root, "images"),
	} {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || st.Uid != a.cred.Uid {
			t.Errorf("%s: mode %v, uid %d: want 0700 and A's", d, fi.Mode().Perm(), st.Uid)
		}
	}
	var paths []string
	filepath.Walk(a.root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !strings.Contains(p, "/rootfs/") {
			paths = append(paths, p)
		}
		return nil
	})
	runscSock := filepath.Join(a.root, "runsc", "runsc-"+id+".sock")
	if _, err := os.Stat(runscSock); err != nil {
		t.Fatalf("no runsc control socket where the test looks: %v", err)
	}
	connect := `perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Peer => $ARGV[0]) or die "$!\n"; print "connected\n"' `
	for _, p := range paths {
		script := "ls -a " + p + " || cat " + p + " || touch " + p + " || rm -f " + p
		if fi, _ := os.Lstat(p); fi != nil && fi.Mode().Type() == os.ModeSocket {
			script = connect + p
		}
		if out, ok := userShell(b, script); ok {
			t.Errorf("B reaches A's %s:\n%s", p, out)
		}
	}
	// The published socket and the sandbox's files outside hutch.
	for _, script := range []string{
		connect + sock, fetch, "rm " + sock, "mv " + sock + " " + sock + ".x",
	} {
		if out, ok := userShell(b, script); ok {
			t.Errorf("B: %s:\n%s", script, out)
		}
	}
	// runsc run by B on A's runsc root.
	runsc := filepath.Join(a.bin, "runsc")
	// (list and delete -force succeed on a root they cannot read, having
	// found nothing there: the sandbox's survival below is what counts.)
	for _, sub := range []string{"list", "state " + id, "exec " + id + " cat /root/secret", "kill " + id + " KILL", "delete -force " + id} {
		out, ok := userShell(b, runsc+" --rootless --root "+filepath.Join(a.root, "runsc")+" "+sub)
		if strings.Contains(out, id) && sub == "list" || strings.Contains(out, "a-secret") || ok && sub != "list" && !strings.HasPrefix(sub, "delete") {
			t.Errorf("B's runsc %s:\n%s", sub, out)
		}
	}
	// A's processes: what /proc keeps for their owner, and signals.
	for _, pid := range procs {
		p := "/proc/" + strconv.Itoa(pid)
		for _, script := range []string{
			"cat " + p + "/environ", "ls " + p + "/root/", "ls " + p + "/cwd/", "ls " + p + "/fd/",
			"cat " + p + "/maps", "dd if=" + p + "/mem bs=1 count=1 skip=4194304",
			"nsenter --target " + strconv.Itoa(pid) + " --user --mount --preserve-credentials true",
			"kill -STOP " + strconv.Itoa(pid), "kill -KILL " + strconv.Itoa(pid), "kill -0 " + strconv.Itoa(pid),
		} {
			if out, ok := userShell(b, script); ok {
				t.Errorf("B: %s:\n%s", script, out)
			}
		}
	}
	// Nothing hutch made for A outside A's state is open to B.
	for _, dir := range []string{os.TempDir(), "/var/tmp"} {
		entries, _ := os.ReadDir(dir)
		for _, de := range entries {
			fi, err := os.Lstat(filepath.Join(dir, de.Name()))
			if err != nil || fi.ModTime().Before(started) || fi.Sys().(*syscall.Stat_t).Uid != a.cred.Uid || !strings.HasPrefix(de.Name(), "hutch") {
				continue
			}
			if fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("A's %s is open to other users: %v", filepath.Join(dir, de.Name()), fi.Mode())
			}
		}
	}

	// A's sandbox ran on throughout, as it was.
	after := a.inspect(id)
	if after.State != "running" || after.Pid != before.Pid {
		t.Fatalf("A's sandbox after B's attempts: %+v (before: %+v)", after, before)
	}
	for _, pid := range procs {
		if !processAlive(pid) {
			t.Errorf("A's process %d is gone", pid)
		}
		if st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(st), ") T ") {
			t.Errorf("A's process %d is stopped", pid)
		}
	}
	if out := a.ok("exec", id, "--", "cat", "/root/secret"); out != "a-secret\n" {
		t.Fatalf("A's secret after B's attempts: %q", out)
	}
	if out, ok := userShell(a, fetch); !ok || out != "a-secret\n" {
		t.Fatalf("A's published socket after B's attempts: %s", out)
	}
	var imgs []struct{ Name string }
	if err := json.Unmarshal([]byte(a.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "a-private:latest" {
		t.Fatalf("A's images after B's attempts: %+v", imgs)
	}
	b.ok("rm", "-f", bid)
	a.ok("rm", "-f", id)
	a.assertClean(id)
}
