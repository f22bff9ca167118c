package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sshClient is an OpenSSH client set up for one sandbox: a key pair and
// the Host block `hutch ssh-config` printed.
type sshClient struct {
	t      *testing.T
	e      *env
	id     string
	key    string // private key; key+".pub" is allowed in
	config string
}

// newSSHClient makes a key pair and writes sandbox id's ssh-config with it.
func newSSHClient(t *testing.T, e *env, id string) *sshClient {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatalf("OpenSSH client missing (scripts/install-deps.sh installs openssh-client): %v", err)
	}
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	c := &sshClient{t: t, e: e, id: id, key: key, config: filepath.Join(dir, "config")}
	conf := e.ok("ssh-config", "--authorized-key", key+".pub", id)
	if err := os.WriteFile(c.config, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *sshClient) host() string { return "hutch-" + c.id }

// run runs an OpenSSH tool (ssh, scp, sftp) with the config.
func (c *sshClient) run(stdin io.Reader, tool string, args ...string) result {
	c.t.Helper()
	return c.runCmd(stdin, tool, append([]string{"-F", c.config, "-o", "BatchMode=yes"}, args...)...)
}

// runCmd runs a program to completion, within two minutes.
func (c *sshClient) runCmd(stdin io.Reader, tool string, args ...string) result {
	c.t.Helper()
	cmd := exec.Command(tool, args...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		c.t.Fatalf("%s %v: timed out\nstdout: %s\nstderr: %s", tool, args, out.String(), errb.String())
	}
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("%s %v: %v", tool, args, err)
	}
	return r
}

// ok runs ssh with args and fails unless it exits 0.
func (c *sshClient) ok(args ...string) string {
	c.t.Helper()
	r := c.run(nil, "ssh", append([]string{c.host()}, args...)...)
	if r.code != 0 {
		c.t.Fatalf("ssh %v: %s", args, r)
	}
	return r.stdout
}

// randomFile writes size random bytes to path and returns their SHA-256.
func randomFile(t *testing.T, path string, size int64) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SSH into a sandbox with no network, with Debian's OpenSSH client and
// `hutch ssh-config`: commands, a pty, exit statuses, scp and sftp of a
// 100 MiB file both ways, local port forwarding, a refused key, and host
// keys.
func TestSSH(t *testing.T) {
	e := newEnv(t)
	id := e.create("--net", "none")
	c := newSSHClient(t, e, id)

	if out := c.ok("uname", "-a"); !strings.Contains(out, "gvisor") {
		t.Fatalf("uname -a over ssh: %q, want gVisor's kernel", out)
	}
	if r := c.run(nil, "ssh", c.host(), "echo out; echo err >&2; exit 7"); r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("exit status and streams over ssh: %s", r)
	}
	// A pty of the sandbox's own devpts.
	r := c.run(nil, "ssh", "-tt", c.host(), "tty")
	if r.code != 0 || !regexp.MustCompile(`^/dev/pts/\d+\r?\n$`).MatchString(r.stdout) {
		t.Fatalf("tty over ssh -tt: %s", r)
	}
	// `hutch ssh` runs the system ssh with the same Host block.
	if out := e.ok("ssh", "--authorized-key", c.key+".pub", id, "--", "echo", "via-hutch-ssh"); out != "via-hutch-ssh\n" {
		t.Fatalf("hutch ssh: %q", out)
	}

	t.Run("scp and sftp", func(t *testing.T) {
		dir := t.TempDir()
		src := filepath.Join(dir, "src")
		want := randomFile(t, src, 100<<20)
		if r := c.run(nil, "scp", src, c.host()+":/tmp/scp-up"); r.code != 0 {
			t.Fatalf("scp up: %s", r)
		}
		if got := strings.Fields(c.ok("sha256sum", "/tmp/scp-up"))[0]; got != want {
			t.Fatalf("scp up: checksum %s inside, want %s", got, want)
		}
		if r := c.run(nil, "scp", c.host()+":/tmp/scp-up", filepath.Join(dir, "scp-down")); r.code != 0 {
			t.Fatalf("scp down: %s", r)
		}
		if got := fileSum(t, filepath.Join(dir, "scp-down")); got != want {
			t.Fatalf("scp down: checksum %s, want %s", got, want)
		}
		c.ok("rm", "/tmp/scp-up") // one copy at a time in the sandbox's memory
		batch := "put " + src + " /tmp/sftp-up\nget /tmp/sftp-up " + filepath.Join(dir, "sftp-down") + "\n"
		if r := c.run(strings.NewReader(batch), "sftp", "-b", "-", c.host()); r.code != 0 {
			t.Fatalf("sftp: %s", r)
		}
		if got := strings.Fields(c.ok("sha256sum", "/tmp/sftp-up"))[0]; got != want {
			t.Fatalf("sftp put: checksum %s inside, want %s", got, want)
		}
		if got := fileSum(t, filepath.Join(dir, "sftp-down")); got != want {
			t.Fatalf("sftp get: checksum %s, want %s", got, want)
		}
	})

	t.Run("local forward", func(t *testing.T) {
		c.ok("mkdir -p /www && echo hello-from-inside > /www/index.html && busybox httpd -p 127.0.0.1:8080 -h /www")
		port := strconv.Itoa(freePort(t))
		fwd := exec.Command("ssh", "-F", c.config, "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
			"-N", "-L", "127.0.0.1:"+port+":127.0.0.1:8080", c.host())
		if err := fwd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { fwd.Process.Kill(); fwd.Wait() }()
		var body string
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			resp, err := http.Get("http://127.0.0.1:" + port + "/index.html")
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if body != "hello-from-inside\n" {
			t.Fatalf("GET through ssh -L from a --net none sandbox: %q", body)
		}
	})

	t.Run("wrong key", func(t *testing.T) {
		other := newSSHClient(t, e, id) // a second key pair, not allowed in by c's config
		conf, err := os.ReadFile(c.config)
		if err != nil {
			t.Fatal(err)
		}
		wrong := strings.ReplaceAll(string(conf), "IdentityFile "+c.key, "IdentityFile "+other.key)
		if wrong == string(conf) {
			t.Fatalf("no IdentityFile %s in ssh-config:\n%s", c.key, conf)
		}
		if err := os.WriteFile(other.config, []byte(wrong), 0o600); err != nil {
			t.Fatal(err)
		}
		r := other.run(nil, "ssh", other.host(), "true")
		if r.code != 255 || !strings.Contains(r.stderr, "Permission denied") {
			t.Fatalf("ssh with a key not allowed in: %s", r)
		}
	})

	t.Run("host keys", func(t *testing.T) {
		hostKey := func(id string) string {
			b, err := os.ReadFile(filepath.Join(e.root, "sandboxes", id, "ssh_known_hosts"))
			if err != nil {
				t.Fatal(err)
			}
			f := strings.Fields(string(b))
			if len(f) < 3 {
				t.Fatalf("known_hosts of %s: %q", id, b)
			}
			return f[1] + " " + f[2]
		}
		first := hostKey(id)
		other := e.create("--net", "none")
		newSSHClient(t, e, other)
		if hostKey(other) == first {
			t.Fatalf("two sandboxes have the same host key %s", first)
		}
		e.ok("pause", id)
		e.ok("resume", id)
		// The pinned key still matches (StrictHostKeyChecking yes).
		if out := c.ok("echo", "after-resume"); out != "after-resume\n" {
			t.Fatalf("ssh after pause and resume: %q", out)
		}
		e.ok("ssh-config", "--authorized-key", c.key+".pub", id)
		if got := hostKey(id); got != first {
			t.Fatalf("host key changed across pause and resume: %s, was %s", got, first)
		}
	})
}

// The default image's user has passwordless sudo, under gVisor, through
// hutch exec and through ssh.
func TestSudoBase(t *testing.T) {
	e := newEnv(t)
	e.root = baseArchive(t)
	id := e.create("--image", "base", "--net", "none")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	if out := e.ok("exec", id, "--", "id", "-un"); out != "user\n" {
		t.Fatalf("default user of base: %q", out)
	}
	if r := e.run(nil, "exec", id, "--", "sudo", "-n", "true"); r.code != 0 || r.stderr != "" {
		t.Fatalf("sudo -n true as user: %s", r)
	}
	if r := e.run(nil, "exec", id, "--", "sudo", "-n", "id", "-u"); r.code != 0 || r.stdout != "0\n" || r.stderr != "" {
		t.Fatalf("sudo -n id -u as user: %s, want 0", r)
	}
	c := newSSHClient(t, e, id)
	if out := c.ok("id -un; sudo -n id -u"); out != "user\n0\n" {
		t.Fatalf("id -un; sudo -n id -u over ssh: %q, want user then 0", out)
	}
}

// rsync -e ssh with `hutch ssh-config`'s Host block, to and from a sandbox
// of the default image (which has rsync): a tree with a symlink and modes
// goes up whole, a second run sends only the changed file, and the tree
// comes back down the same.
func TestSSHRsync(t *testing.T) {
	if _, err := exec.LookPath("rsync"); err != nil {
		t.Fatalf("rsync missing (scripts/install-deps.sh installs it): %v", err)
	}
	e := newEnv(t)
	e.root = baseArchive(t)
	id := e.create("--image", "base", "--net", "none")
	t.Cleanup(func() { e.run(nil, "rm", "-f", id) })
	c := newSSHClient(t, e, id)

	src := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	randomFile(t, filepath.Join(src, "a", "big"), 8<<20)
	for name, body := range map[string]string{"a/b/small": "small\n", "run.sh": "#!/bin/sh\necho run\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "run.sh"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a/b/small", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	// What a user would compare: contents, the link, the mode.
	const listing = `find . -type f | sort | xargs sha256sum; find . -type l -printf '%p -> %l\n'; stat -c '%a %n' run.sh`
	local := func(dir string) string {
		t.Helper()
		cmd := exec.Command("sh", "-c", listing)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("listing %s: %v", dir, err)
		}
		return string(out)
	}
	rsync := func(args ...string) string {
		t.Helper()
		r := c.runCmd(nil, "rsync", append([]string{"-a", "--stats", "-e", "ssh -F " + c.config + " -o BatchMode=yes"}, args...)...)
		if r.code != 0 {
			t.Fatalf("rsync %v: %s", args, r)
		}
		return r.stdout
	}
	transferred := regexp.MustCompile(`Number of regular files transferred: (\d+)`)
	sent := func(stats string) string {
		m := transferred.FindStringSubmatch(stats)
		if m == nil {
			t.Fatalf("no transfer count in rsync's --stats:\n%s", stats)
		}
		return m[1]
	}

	if n := sent(rsync(src+"/", c.host()+":tree/")); n != "3" {
		t.Fatalf("first rsync up sent %s files, want 3", n)
	}
	if got, want := c.ok("cd tree && "+listing), local(src); got != want {
		t.Fatalf("tree in the sandbox after rsync up:\n%s\nwant:\n%s", got, want)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "b", "small"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := sent(rsync(src+"/", c.host()+":tree/")); n != "1" {
		t.Fatalf("second rsync up sent %s files, want only the changed one", n)
	}
	dst := filepath.Join(t.TempDir(), "down")
	if n := sent(rsync(c.host()+":tree/", dst+"/")); n != "3" {
		t.Fatalf("rsync down sent %s files, want 3", n)
	}
	if got, want := local(dst), local(src); got != want {
		t.Fatalf("tree after rsync down:\n%s\nwant:\n%s", got, want)
	}
}
