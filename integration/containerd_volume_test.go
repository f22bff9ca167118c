package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Kubernetes volume mounts (CRI host-path mounts) in a pod run by the hutch
// shim behave as hutch's own -v (docs/decisions/0013-volumes.md): a host
// write is seen in the container within a second and the container's write
// reaches the host; a read-only mount refuses writes with EROFS; two
// containers of one pod mounting the same directory see each other's
// writes.
func TestContainerdVolumeMounts(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	shared := t.TempDir()
	ro := t.TempDir()
	for _, d := range []string{shared, ro} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "f"), []byte("read-only\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	podCfg := c.podConfig("vols", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	container := func(name, mounts string) string {
		cfg := c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":["sh","-c","echo up; sleep 1000"],"log_path":%q,"mounts":[%s]}`,
			name, criBusyboxImage, name+".log", mounts))
		id := c.crictlOK("create", pod, cfg, podCfg)
		c.crictlOK("start", id)
		waitFor(t, func() bool { return strings.Contains(c.crictl("logs", id).stdout, "up") })
		return id
	}
	a := container("a", fmt.Sprintf(`{"container_path":"/v","host_path":%q},{"container_path":"/ro","host_path":%q,"readonly":true}`, shared, ro))
	b := container("b", fmt.Sprintf(`{"container_path":"/shared","host_path":%q}`, shared))

	// seen waits (a second at most, at least one look) for path to read
	// want in container ctr.
	seen := func(t *testing.T, ctr, path, want string) {
		t.Helper()
		deadline := time.Now().Add(time.Second)
		for {
			r := c.crictl("exec", "-s", ctr, "cat", path)
			// crictl exec -s ends its output with extra newlines.
			if r.code == 0 && strings.TrimRight(r.stdout, "\n") == strings.TrimRight(want, "\n") {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%s in container %s: %s; want %q within a second", path, ctr, r, want)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	t.Run("a host write is seen in the container, and its write reaches the host", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(shared, "from-host"), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		seen(t, a, "/v/from-host", "host\n")
		if err := os.WriteFile(filepath.Join(shared, "from-host"), []byte("host, again\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		seen(t, a, "/v/from-host", "host, again\n")
		c.crictlOK("exec", "-s", a, "sh", "-c", "echo container > /v/from-container")
		if b, err := os.ReadFile(filepath.Join(shared, "from-container")); err != nil || string(b) != "container\n" {
			t.Errorf("the host reads the container's write as %q, %v", b, err)
		}
	})

	t.Run("a read-only mount refuses writes with EROFS", func(t *testing.T) {
		seen(t, a, "/ro/f", "read-only\n")
		r := c.crictl("exec", "-s", a, "sh", "-c", "echo x > /ro/f")
		if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "Read-only file system") {
			t.Errorf("writing a read-only mount: %s; want refused with Read-only file system", r)
		}
		r = c.crictl("exec", "-s", a, "touch", "/ro/new")
		if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "Read-only file system") {
			t.Errorf("creating a file in a read-only mount: %s; want refused with Read-only file system", r)
		}
		if b, err := os.ReadFile(filepath.Join(ro, "f")); err != nil || string(b) != "read-only\n" {
			t.Errorf("the read-only mount's host file is now %q, %v", b, err)
		}
		if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
			t.Errorf("a file appeared in the read-only mount's host directory")
		}
	})

	t.Run("two containers of the pod share the mount", func(t *testing.T) {
		c.crictlOK("exec", "-s", a, "sh", "-c", "echo from-a > /v/pair")
		seen(t, b, "/shared/pair", "from-a\n")
		c.crictlOK("exec", "-s", b, "sh", "-c", "echo from-b > /shared/pair")
		seen(t, a, "/v/pair", "from-b\n")
	})

	t.Run("a container's set-ID bits never reach the host", func(t *testing.T) {
		c.crictlOK("exec", "-s", a, "sh", "-c", "echo x > /v/suid && chmod 6755 /v/suid && mkdir /v/sgid && chmod 2777 /v/sgid")
		for _, name := range []string{"suid", "sgid"} {
			fi, err := os.Stat(filepath.Join(shared, name))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
				t.Errorf("%s on the host is %v: a set-ID bit from the container", name, fi.Mode())
			}
		}
	})

	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, a, b)
}
