package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sharedImagesDir makes an empty directory for a shared image store,
// root's and traversable by everyone, as /var/lib is.
func sharedImagesDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "hutch-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "images")
}

// userShell runs a shell command as e's unprivileged user and returns its
// combined output and whether it succeeded.
func userShell(e *env, script string) (string, bool) {
	e.t.Helper()
	c := exec.Command("sh", "-c", script)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: e.cred}
	c.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, e.extra...)
	out, err := c.CombinedOutput()
	return string(out), err == nil
}

// Root shares the default image once; an unprivileged user's sandbox
// then runs on it with no root action at run time, and the user reads
// nothing of root's state but the shared images.
func TestRootlessSharedImage(t *testing.T) {
	base := baseArchive(t)
	shared := sharedImagesDir(t)
	root := &env{t: t, bin: binDir(t), root: base, extra: []string{"HUTCH_SHARED_IMAGES=" + shared, "ROOT_TOKEN=root-secret"}}
	if out := root.ok("image", "share", "base"); !strings.HasPrefix(out, "base:latest ") {
		t.Fatalf("image share: %q", out)
	}

	u := newRootlessEnv(t)
	u.extra = append(u.extra, "HUTCH_SHARED_IMAGES="+shared)
	r := u.run(nil, "run", "--rm", "--", "python3", "-c", "print(1)")
	if r.code != 0 || r.stdout != "1\n" {
		t.Fatalf("rootless run on the shared default image: %s", r)
	}
	var imgs []struct{ Name, Source string }
	if err := json.Unmarshal([]byte(u.ok("image", "ls", "--format", "json")), &imgs); err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Name != "base:latest" || imgs[0].Source != "shared" {
		t.Fatalf("the user's images: %+v", imgs)
	}

	// Root's own state stays root's: with a sandbox of root's running,
	// the user can list or read none of it, only the shared layout.
	id := root.create("--name", "roots", "--secret", "TOKEN=env:ROOT_TOKEN")
	defer root.run(nil, "rm", "-f", id)
	for _, p := range []string{
		base, filepath.Join(base, "sandboxes"), filepath.Join(base, "sandboxes", id),
		filepath.Join(base, "images", "oci", "index.json"), filepath.Join(base, "images", "rootfs"),
	} {
		if out, ok := userShell(u, "ls "+p+" || cat "+p); ok {
			t.Errorf("the user reads root's %s:\n%s", p, out)
		}
	}
	if out, ok := userShell(u, "cat "+filepath.Join(shared, "oci", "index.json")); !ok || !strings.Contains(out, "base:latest") {
		t.Fatalf("the user cannot read the shared index: %s", out)
	}
	if out, ok := userShell(u, "touch "+filepath.Join(shared, "oci", "x")); ok {
		t.Fatalf("the user writes into the shared store: %s", out)
	}

	// A shared store that other users could change is not trusted.
	if err := os.Chmod(filepath.Join(shared, "oci"), 0o777); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Join(shared, "oci"), 0o755)
	other := newRootlessEnv(t)
	other.extra = append(other.extra, "HUTCH_SHARED_IMAGES="+shared)
	assertOneLineError(t, other.run(nil, "run", "--rm", "--", "true"), "writable by other users")
	os.Chmod(filepath.Join(shared, "oci"), 0o755)

	// Sharing is root's.
	assertOneLineError(t, u.run(nil, "image", "share", "base"), "needs root")
}

// Without cgroup delegation (this host is cgroup v1) a rootless sandbox
// runs with --cpus and --memory unenforced, says so, and refuses them
// when asked for; --pids holds inside gVisor.
func TestRootlessLimits(t *testing.T) {
	e := newRootlessEnv(t)
	for _, flag := range []string{"--memory=1g", "--cpus=1"} {
		r := e.run(nil, "create", "--image", "busybox", flag)
		assertOneLineError(t, r, "cannot be enforced for an unprivileged user")
		assertOneLineError(t, r, strings.Split(flag, "=")[0])
	}
	if ls := e.list(); len(ls) != 0 {
		t.Fatalf("a refused create left sandboxes: %+v", ls)
	}
	r := e.run(nil, "create", "--image", "busybox")
	if r.code != 0 || !strings.Contains(r.stderr, "warning: --cpus and --memory not enforced") {
		t.Fatalf("rootless create: want a warning naming --cpus and --memory, got %s", r)
	}
	id := strings.TrimSpace(r.stdout)
	var sb struct {
		Rootless         bool     `json:"rootless"`
		UnenforcedLimits []string `json:"unenforced_limits"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", id)), &sb); err != nil {
		t.Fatal(err)
	}
	if !sb.Rootless || strings.Join(sb.UnenforcedLimits, ",") != "cpus,memory" {
		t.Fatalf("inspect: %+v", sb)
	}
	e.ok("rm", "-f", id)

	// The process limit holds without a cgroup: a shell cannot start
	// more than --pids processes.
	r = e.run(nil, "run", "--rm", "--image", "busybox", "--pids", "10", "--", "sh", "-c",
		"for i in $(seq 1 30); do sleep 5 & done; echo done")
	if !strings.Contains(r.stderr, "fork") {
		t.Fatalf("30 processes under --pids 10: want a failed fork, got %s", r)
	}
	r = e.run(nil, "run", "--rm", "--image", "busybox", "--", "sh", "-c",
		"for i in $(seq 1 30); do sleep 1 & done; wait; echo done")
	if r.code != 0 || strings.Contains(r.stderr, "fork") {
		t.Fatalf("30 processes under the default --pids: %s", r)
	}
}

// doctor, run by an unprivileged user, lists what the user can do and
// what is missing, each with its fix.
func TestRootlessDoctor(t *testing.T) {
	e := newRootlessEnv(t)
	e.extra = append(e.extra, "HUTCH_SHARED_IMAGES="+sharedImagesDir(t))
	r := e.run(nil, "doctor")
	if r.code != 0 {
		t.Fatalf("rootless doctor: %s", r)
	}
	lines := strings.Split(r.stdout, "\n")
	find := func(name string) (string, string) {
		for i, l := range lines {
			f := strings.Fields(l)
			if len(f) >= 2 && f[1] == name {
				fix := ""
				if i+1 < len(lines) && strings.Contains(lines[i+1], "fix:") {
					fix = lines[i+1]
				}
				return l, fix
			}
		}
		t.Fatalf("doctor lists no %s:\n%s", name, r.stdout)
		return "", ""
	}
	for _, name := range []string{"userns", "netstack", "limits", "builds", "images"} {
		line, fix := find(name)
		if !strings.HasPrefix(line, "ok") && fix == "" {
			t.Errorf("doctor's %s is not ok and has no fix:\n%s", name, r.stdout)
		}
	}
	if line, fix := find("limits"); !strings.Contains(line, "NOT enforced: cpus, memory") || !strings.Contains(fix, "systemd-run --user --scope") {
		t.Errorf("doctor's limits on a host without delegation: %q %q", line, fix)
	}
	if line, fix := find("images"); !strings.HasPrefix(line, "note") || !strings.Contains(fix, "hutch image share base") {
		t.Errorf("doctor's images without a shared base: %q %q", line, fix)
	}
}
