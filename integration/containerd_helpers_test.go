package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/assembly/hostnet"
)

// ctrd is a private containerd for one test: its own root, state, socket
// and config, with the hutch shim as runtime io.containerd.hutch.v1 and as
// the CRI runtime handler "hutch".
type ctrd struct {
	t    *testing.T
	bin  string
	dir  string
	sock string
	cmd  *exec.Cmd
	// shimConfig is the shim's runtime options file (ConfigPath).
	shimConfig string
}

// Images the CRI tests use: names without a registry host, so that CRI
// does not normalize them to one.
const (
	criPauseImage   = "localhost/hutch/pause:1"
	criBusyboxImage = "localhost/hutch/busybox:latest"
)

// setShimConfig writes the shim's options file: runsc and its state
// directory, then policy, TOML lines that the operator sets (the defaults
// and ceiling of pods). A pod's shim reads it when the pod is created.
func (c *ctrd) setShimConfig(policy string) {
	c.t.Helper()
	body := fmt.Sprintf("runsc = %q\nrunsc_root = %q\n%s\n", filepath.Join(c.bin, "runsc"), filepath.Join(c.dir, "runsc"), policy)
	if err := os.WriteFile(c.shimConfig, []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// newContainerd starts a private containerd and stops it (and everything
// it ran) at the end of the test.
func newContainerd(t *testing.T) *ctrd {
	requiresRoot(t)
	bin := binDir(t)
	for _, f := range []string{"containerd", "ctr", "crictl", "containerd-shim-hutch-v1", "images/pause.tar"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Fatalf("%s not built (run `make shim containerd-tools`): %v", f, err)
		}
	}
	dir := t.TempDir()
	c := &ctrd{t: t, bin: bin, dir: dir, sock: filepath.Join(dir, "c.sock"), shimConfig: filepath.Join(dir, "shim.toml")}
	c.setShimConfig("")
	cfg := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %[5]q
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "hutch"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.hutch]
  runtime_type = "io.containerd.hutch.v1"
  pod_annotations = ["dev.hutch.*"]
  container_annotations = ["dev.hutch.*"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.hutch.options]
    ConfigPath = %[6]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc", criPauseImage, c.shimConfig)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start()
	t.Cleanup(c.cleanup)
	return c
}

func (c *ctrd) start() {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bin, "containerd"), "--config", filepath.Join(c.dir, "config.toml"))
	// containerd finds the shim as containerd-shim-hutch-v1 on its PATH.
	cmd.Env = append(os.Environ(), "PATH="+c.bin+":"+os.Getenv("PATH"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmd = cmd
	waitFor(c.t, func() bool {
		return c.ctr("default", "version").code == 0
	})
}

// stopDaemon stops containerd, leaving its shims running.
func (c *ctrd) stopDaemon() {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may be gone
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }() //nolint:errcheck // its status does not matter
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill() //nolint:errcheck // stuck
		<-done
	}
	c.cmd = nil
}

// restart restarts containerd, e.g. for CRI to load images afresh.
func (c *ctrd) restart() {
	c.stopDaemon()
	c.start()
}

// cleanup removes every pod and task, stops containerd and then kills
// and unmounts whatever is left, so that a failed test does not leak
// into the next.
func (c *ctrd) cleanup() {
	if c.cmd != nil {
		c.crictl("rmp", "-af")
		for _, ns := range []string{"default", "k8s.io"} {
			for _, id := range strings.Fields(c.ctr(ns, "task", "ls", "-q").stdout) {
				c.ctr(ns, "task", "kill", "-s", "KILL", id)
			}
			for _, id := range strings.Fields(c.ctr(ns, "task", "ls", "-q").stdout) {
				c.ctr(ns, "task", "rm", "-f", id)
			}
			for _, id := range strings.Fields(c.ctr(ns, "container", "ls", "-q").stdout) {
				c.ctr(ns, "container", "rm", id)
			}
		}
	}
	c.stopDaemon()
	for _, p := range processesMentioning(c.dir) {
		pid, _, _ := strings.Cut(strings.TrimPrefix(p, "process "), ":")
		if n, err := strconv.Atoi(pid); err == nil {
			syscall.Kill(n, syscall.SIGKILL) //nolint:errcheck // cleanup
		}
	}
	for _, m := range c.mounts() {
		syscall.Unmount(m, syscall.MNT_DETACH) //nolint:errcheck // cleanup
	}
}

// mounts lists mount points below the test's directory.
func (c *ctrd) mounts() []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], c.dir) {
			out = append(out, f[4])
		}
	}
	return out
}

func (c *ctrd) exec(name string, args []string, stdin io.Reader) result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = stdin
	}
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("%s %v: %v", name, args, err)
	}
	return r
}

// ctr runs ctr against the private containerd in namespace ns.
func (c *ctrd) ctr(ns string, args ...string) result {
	c.t.Helper()
	return c.exec("ctr", append([]string{"-a", c.sock, "-n", ns}, args...), nil)
}

// ctrOK runs ctr and fails the test unless it exits 0.
func (c *ctrd) ctrOK(ns string, args ...string) string {
	c.t.Helper()
	r := c.ctr(ns, args...)
	if r.code != 0 {
		c.t.Fatalf("ctr %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// crictl runs crictl against the private containerd's CRI.
func (c *ctrd) crictl(args ...string) result {
	c.t.Helper()
	ep := "unix://" + c.sock
	return c.exec("crictl", append([]string{"--config", os.DevNull, "-r", ep, "-i", ep, "-t", "60s"}, args...), nil)
}

func (c *ctrd) crictlOK(args ...string) string {
	c.t.Helper()
	r := c.crictl(args...)
	if r.code != 0 {
		c.t.Fatalf("crictl %s: %s", strings.Join(args, " "), r)
	}
	return strings.TrimSpace(r.stdout)
}

// importBusybox exports busybox from hutch's own image store and imports it
// into containerd's namespace ns as busybox:latest.
func (c *ctrd) importBusybox(ns string) {
	c.t.Helper()
	e := newEnv(c.t)
	archive := filepath.Join(c.dir, "busybox.tar")
	e.ok("image", "import", "busybox", filepath.Join(c.bin, "images", "busybox.tar"))
	e.ok("image", "export", "busybox", archive)
	c.ctrOK(ns, "image", "import", archive)
}

// setupCRI imports the pause and busybox images into k8s.io under names
// CRI does not rewrite, and restarts containerd so that CRI sees only
// those.
func (c *ctrd) setupCRI() {
	c.t.Helper()
	c.importBusybox("k8s.io")
	c.ctrOK("k8s.io", "image", "import", filepath.Join(c.bin, "images", "pause.tar"))
	c.ctrOK("k8s.io", "image", "tag", "busybox:latest", criBusyboxImage)
	c.ctrOK("k8s.io", "image", "tag", "pause:hutch", criPauseImage)
	c.ctrOK("k8s.io", "image", "rm", "busybox:latest", "pause:hutch")
	c.restart()
}

// writeJSON writes a crictl config file into the test directory.
func (c *ctrd) writeJSON(name, body string) string {
	c.t.Helper()
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// leftovers lists what the given containers left on the host: runsc and
// shim processes of this containerd, mounts below its directories,
// cgroups and network set-up.
func (c *ctrd) leftovers(ids ...string) []string {
	var left []string
	self := ""
	if c.cmd != nil {
		self = strconv.Itoa(c.cmd.Process.Pid)
	}
	for _, p := range processesMentioning(c.dir) {
		if strings.HasPrefix(p, "process "+self+":") {
			continue
		}
		left = append(left, p)
	}
	for _, m := range c.mounts() {
		if strings.Contains(m, "io.containerd.runtime.v2.task") {
			left = append(left, "mount: "+m)
		}
	}
	for _, id := range ids {
		for _, pat := range []string{"/sys/fs/cgroup/*/*/" + id, "/sys/fs/cgroup/*/" + id} {
			m, _ := filepath.Glob(pat)
			for _, d := range m {
				left = append(left, "cgroup: "+d)
			}
		}
		left = append(left, hostnet.Leftovers(context.Background(), id)...)
		if m, _ := filepath.Glob(filepath.Join(c.dir, "runsc", "*", id+"_sandbox:*")); len(m) > 0 {
			left = append(left, "runsc state: "+strings.Join(m, " "))
		}
	}
	return left
}

func (c *ctrd) assertClean(ids ...string) {
	c.t.Helper()
	var left []string
	// Teardown is asynchronous in places (the shim exits after delete).
	for i := 0; i < 50; i++ {
		if left = c.leftovers(ids...); len(left) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("left behind:\n%s", strings.Join(left, "\n"))
}
