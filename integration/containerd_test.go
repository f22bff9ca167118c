package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const hutchRuntime = "io.containerd.hutch.v1"

// ctr run with the hutch runtime: output and exit status of a run, exec with
// and without a terminal, kill; nothing is left once the task is removed.
func TestContainerdRun(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")

	r := c.ctr("default", "run", "--rm", "--runtime", hutchRuntime, "--runtime-config-path", c.shimConfig,
		"busybox:latest", "once", "sh", "-c", "echo hello from $(uname -r); echo oops >&2; exit 3")
	if r.code != 3 || !strings.Contains(r.stdout, "hello from") || !strings.Contains(r.stdout, "gvisor") {
		t.Fatalf("ctr run: want exit 3 and output from gVisor's kernel, got %s", r)
	}
	if !strings.Contains(r.stderr, "oops") {
		t.Fatalf("ctr run: stderr lost: %s", r)
	}

	// A task that cannot start: runsc's reason, and nothing left.
	r = c.ctr("default", "run", "--rm", "--runtime", hutchRuntime, "busybox:latest", "broken", "no-such-command")
	if r.code == 0 || !strings.Contains(r.stderr, `"no-such-command"`) {
		t.Fatalf("run of a missing command: %s", r)
	}
	c.assertClean("broken")

	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "busybox:latest", "long", "sh", "-c", "while true; do sleep 1; done")
	if out := c.ctrOK("default", "task", "ls"); !strings.Contains(out, "RUNNING") {
		t.Fatalf("task not running:\n%s", out)
	}
	r = c.ctr("default", "task", "exec", "--exec-id", "e1", "long", "sh", "-c", "echo in-exec; ps; exit 5")
	if r.code != 5 || !strings.Contains(r.stdout, "in-exec") || !strings.Contains(r.stdout, "while true") {
		t.Fatalf("exec: want exit 5 and the task's processes, got %s", r)
	}
	r = c.exec("ctr", []string{"-a", c.sock, "task", "exec", "--exec-id", "e2", "long", "cat"}, strings.NewReader("through stdin\n"))
	if r.code != 0 || r.stdout != "through stdin\n" {
		t.Fatalf("exec with stdin: %s", r)
	}
	if r = c.ctr("default", "task", "exec", "--exec-id", "e3", "long", "no-such-program"); r.code == 0 {
		t.Fatalf("exec of a missing program succeeded: %s", r)
	}
	// A terminal: ctr needs one of its own, which script(1) provides.
	out, err := exec.Command("script", "-qec", fmt.Sprintf("%s -a %s task exec -t --exec-id e4 long sh -c 'test -t 0 && test -t 1 && echo is-a-tty; exit 6'",
		filepath.Join(c.bin, "ctr"), c.sock), "/dev/null").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 6 || !strings.Contains(string(out), "is-a-tty") {
		t.Fatalf("exec -t: want exit 6 on a terminal, got %v: %q", err, out)
	}
	out, err = exec.Command("script", "-qec", fmt.Sprintf("%s -a %s run --rm -t --runtime %s busybox:latest tty sh -c 'test -t 0 && echo init-on-tty; exit 2'",
		filepath.Join(c.bin, "ctr"), c.sock, hutchRuntime), "/dev/null").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "init-on-tty") {
		t.Fatalf("run -t: want exit 2 on a terminal, got %v: %q", err, out)
	}
	if out := c.ctrOK("default", "task", "ps", "long"); len(strings.Split(strings.TrimSpace(out), "\n")) < 3 {
		t.Fatalf("task ps: %s", out)
	}
	c.ctrOK("default", "task", "pause", "long")
	if out := c.ctrOK("default", "task", "ls"); !strings.Contains(out, "PAUSED") {
		t.Fatalf("task not paused:\n%s", out)
	}
	c.ctrOK("default", "task", "resume", "long")
	if out := c.ctrOK("default", "task", "metrics", "long"); !strings.Contains(out, "pids") {
		t.Fatalf("task metrics: %s", out)
	}
	c.ctrOK("default", "task", "kill", "long")
	waitFor(t, func() bool { return strings.Contains(c.ctrOK("default", "task", "ls"), "STOPPED") })
	c.ctrOK("default", "task", "rm", "long")
	c.ctrOK("default", "container", "rm", "long")
	c.assertClean("once", "long")
}

// podConfig is a crictl pod sandbox config without a network namespace
// of its own (no CNI here), so in hutch's network: none unless the
// annotations name one, and the given annotations.
func (c *ctrd) podConfig(name string, annotations map[string]string, extra string) string {
	// The host's network is refused: a pod runs in hutch's network.
	_, net := annotations["dev.hutch.network"]
	_, allow := annotations["dev.hutch.allow"]
	var ann []string
	if !net && !allow {
		ann = append(ann, `"dev.hutch.network":"none"`)
	}
	for k, v := range annotations {
		ann = append(ann, fmt.Sprintf("%q:%q", k, v))
	}
	return c.writeJSON("pod-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"default","uid":%q},
"linux":{%s"security_context":{"namespace_options":{"network":2}}},"log_directory":%q,"annotations":{%s}}`,
		name, name+"-uid", extra, filepath.Join(c.dir, "logs", name), strings.Join(ann, ",")))
}

func (c *ctrd) containerConfig(name string, cmd ...string) string {
	q := make([]string, len(cmd))
	for i, a := range cmd {
		q[i] = strconv.Quote(a)
	}
	return c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":[%s],"log_path":%q}`,
		name, criBusyboxImage, strings.Join(q, ","), name+".log"))
}

// runContainer creates and starts a container in the pod.
func (c *ctrd) runContainer(pod, podCfg, name string, cmd ...string) string {
	c.t.Helper()
	id := c.crictlOK("create", pod, c.containerConfig(name, cmd...), podCfg)
	c.crictlOK("start", id)
	return id
}

// A CRI pod through crictl with runtime handler hutch: two containers share
// one gVisor sandbox (one kernel, one localhost); logs, exec -s, stop and
// removal work and leave nothing behind.
func TestContainerdCRIPod(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()

	podCfg := c.podConfig("web", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	server := c.runContainer(pod, podCfg, "server", "sh", "-c",
		"echo server up; while true; do echo pong | nc -l -p 8080; done")
	client := c.runContainer(pod, podCfg, "client", "sh", "-c", "echo client up; sleep 1000")

	waitFor(t, func() bool { return strings.Contains(c.crictl("logs", server).stdout, "server up") })
	r := c.crictl("exec", "-s", client, "sh", "-c", "echo ping | nc 127.0.0.1 8080")
	if r.code != 0 || !strings.Contains(r.stdout, "pong") {
		t.Fatalf("client did not reach the server over the pod's localhost: %s", r)
	}
	// One kernel: the client sees the server's processes and the pause
	// program as PID 1.
	r = c.crictl("exec", "-s", client, "ps")
	if r.code != 0 || !strings.Contains(r.stdout, "nc -l -p 8080") || !strings.Contains(r.stdout, "1 root     /pause") {
		t.Fatalf("containers do not share one sandbox: %s", r)
	}
	// A container that exits on its own: its status and output.
	job := c.runContainer(pod, podCfg, "job", "sh", "-c", "echo bye; exit 3")
	waitFor(t, func() bool { return strings.Contains(c.crictlOK("inspect", job), `"exitCode": 3`) })
	if out := c.crictlOK("logs", job); out != "bye" {
		t.Fatalf("job logs: %q", out)
	}
	c.crictlOK("rm", job)

	// crictl exits 1 and names the command's status.
	if r = c.crictl("exec", "-s", client, "sh", "-c", "exit 7"); r.code == 0 || !strings.Contains(r.stderr, "exited with 7") {
		t.Fatalf("exec -s exit status: %s", r)
	}

	// Resources: an update within hutch's bounds is applied, one below
	// them is refused with the validator's message.
	c.crictlOK("update", "--memory", "268435456", client)
	if r = c.crictl("update", "--memory", "1048576", client); r.code == 0 || !strings.Contains(r.stderr, "below the minimum") {
		t.Fatalf("update below the minimum memory: %s", r)
	}
	if out := c.crictlOK("stats", "-o", "json", client); !strings.Contains(out, "workingSetBytes") {
		t.Fatalf("stats: %s", out)
	}

	c.crictlOK("stop", client)
	if out := c.crictlOK("inspect", client); !strings.Contains(out, `"state": "CONTAINER_EXITED"`) {
		t.Fatalf("stopped container: %s", out)
	}
	c.crictlOK("rm", client)
	c.crictlOK("stopp", pod)
	c.crictlOK("rmp", pod)
	c.assertClean(pod, server, client, job)
}

// The network annotation, observed from inside the pod: none has only
// loopback; open has the pod's own link with an address and a resolver.
// A pod whose annotations fail validation is refused with the
// validator's message, and nothing is left.
func TestContainerdNetworkAnnotation(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	// The operator allows open; a pod may ask for it or tighten it.
	c.setShimConfig(`network = "open"`)

	probe := []string{"sh", "-c", "cat /proc/net/dev; ip -4 addr; cat /etc/resolv.conf; echo probe-done; sleep 1000"}
	noneCfg := c.podConfig("quiet", map[string]string{"dev.hutch.network": "none"}, "")
	none := c.crictlOK("runp", "--runtime", "hutch", noneCfg)
	cn := c.runContainer(none, noneCfg, "probe", probe...)
	openCfg := c.podConfig("chatty", map[string]string{"dev.hutch.network": "open"}, "")
	open := c.crictlOK("runp", "--runtime", "hutch", openCfg)
	co := c.runContainer(open, openCfg, "probe", probe...)

	var noneOut, openOut string
	waitFor(t, func() bool {
		noneOut, openOut = c.crictl("logs", cn).stdout, c.crictl("logs", co).stdout
		return strings.Contains(noneOut, "probe-done") && strings.Contains(openOut, "probe-done")
	})
	if strings.Contains(noneOut, "eth0") {
		t.Fatalf("network none: the pod has a link:\n%s", noneOut)
	}
	if !strings.Contains(openOut, "eth0") || !strings.Contains(openOut, "inet 10.200.") || !strings.Contains(openOut, "nameserver 10.200.") {
		t.Fatalf("network open: no link, address or resolver:\n%s", openOut)
	}
	c.crictlOK("rmp", "-f", none, open)
	c.assertClean(none, open, cn, co)

	badCfg := c.podConfig("bad", map[string]string{"dev.hutch.network": "sideways"}, "")
	r := c.crictl("runp", "--runtime", "hutch", badCfg)
	if r.code == 0 || !strings.Contains(unescape(r.stderr), `--net "sideways": want one of none, open, allow`) {
		t.Fatalf("bad network annotation: want the validator's message, got %s", r)
	}
	badAllow := c.podConfig("bad2", map[string]string{"dev.hutch.network": "none", "dev.hutch.allow": "example.com"}, "")
	r = c.crictl("runp", "--runtime", "hutch", badAllow)
	if r.code == 0 || !strings.Contains(r.stderr, "--allow needs --net open or allow") {
		t.Fatalf("allow rules with network none: want the validator's message, got %s", r)
	}
	if out := c.crictlOK("pods", "-q"); out != "" {
		// CRI keeps no pod whose sandbox failed; nothing may run either.
		t.Fatalf("refused pods are listed: %q", out)
	}
	c.assertClean()
}

// Checkpoint and restore through ctr: the checkpoint (memory and the
// sandbox's filesystem changes) is an image in containerd's content store,
// and a new task restored from it carries on counting.
func TestContainerdCheckpointRestore(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")
	count := func(id string) int {
		t.Helper()
		out := c.ctrOK("default", "task", "exec", "--exec-id", fmt.Sprintf("read-%d", time.Now().UnixNano()), id, "cat", "/count")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("counter: %q", out)
		}
		return n
	}
	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "busybox:latest", "counter", "sh", "-c",
		"i=0; while true; do i=$((i+1)); echo $i > /count.tmp; mv /count.tmp /count; sleep 0.1; done")
	waitFor(t, func() bool {
		return c.ctr("default", "task", "exec", "--exec-id", "probe", "counter", "test", "-s", "/count").code == 0
	})
	waitFor(t, func() bool { return count("counter") >= 30 })

	// ctr task checkpoint: an image in the content store, with the
	// filesystem changes beside runsc's memory image.
	ref := strings.TrimSpace(c.ctrOK("default", "task", "checkpoint", "counter"))
	if !strings.Contains(c.ctrOK("default", "image", "ls", "-q"), ref) {
		t.Fatalf("checkpoint image %q not listed", ref)
	}
	if !c.checkpointHas(ref, "rootfs-upper.tar") {
		t.Fatalf("checkpoint %s has no rootfs-upper.tar", ref)
	}

	// A container checkpoint (the task's, plus image and runtime) that a
	// new container is restored from.
	c.ctrOK("default", "container", "checkpoint", "--task", "--image", "counter", "counter-ckpt")
	c.ctrOK("default", "task", "kill", "-s", "KILL", "counter")
	waitFor(t, func() bool { return strings.Contains(c.ctrOK("default", "task", "ls"), "STOPPED") })
	c.ctrOK("default", "task", "rm", "counter")
	c.ctrOK("default", "container", "rm", "counter")

	c.ctrOK("default", "container", "restore", "--live", "restored", "counter-ckpt")
	// The checkpoint was taken with the counter past 30; counting
	// afresh would be at a few by now.
	first := count("restored")
	if first < 30 {
		t.Fatalf("restored counter is at %d: it started afresh instead of from the checkpoint", first)
	}
	waitFor(t, func() bool { return count("restored") > first })
	c.ctrOK("default", "task", "kill", "-s", "KILL", "restored")
	waitFor(t, func() bool { return strings.Contains(c.ctrOK("default", "task", "ls"), "STOPPED") })
	c.ctrOK("default", "task", "rm", "restored")
	c.ctrOK("default", "container", "rm", "restored")
	c.assertClean("counter", "restored")
}

// checkpointHas reports whether the checkpoint image ref holds a file
// named name in its runtime checkpoint layer.
func (c *ctrd) checkpointHas(ref, name string) bool {
	c.t.Helper()
	idx := c.ctrOK("default", "content", "get", c.imageDigest(ref))
	for _, f := range strings.Split(idx, `"digest":"`)[1:] {
		d, _, _ := strings.Cut(f, `"`)
		r := c.ctr("default", "content", "get", d)
		if strings.Contains(r.stdout, name) {
			return true
		}
	}
	return false
}

func (c *ctrd) imageDigest(ref string) string {
	for _, l := range strings.Split(c.ctrOK("default", "image", "ls"), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[0] == ref {
			return f[2]
		}
	}
	c.t.Fatalf("image %s not found", ref)
	return ""
}

// An OOM in a pod reaches containerd as an OOM event: the pod's cgroup
// (made here as kubelet makes it, with a memory limit) holds the sandbox,
// and CRI reports the container OOMKilled.
func TestContainerdOOM(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	// A parent of our own, removed with everything below it.
	parent := "/hutchtest" + strconv.Itoa(os.Getpid())
	podCg := parent + "/podhutch"
	memDir := "/sys/fs/cgroup/memory" + podCg
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err != nil {
		memDir = "/sys/fs/cgroup" + podCg // cgroup v2
	}
	if err := os.MkdirAll(memDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + podCg)
		dirs2, _ := filepath.Glob("/sys/fs/cgroup/*" + parent)
		for _, d := range append(append(dirs, dirs2...), "/sys/fs/cgroup"+podCg, "/sys/fs/cgroup"+parent) {
			os.Remove(d)
		}
	})
	limitFile, limit := "memory.limit_in_bytes", "67108864"
	if _, err := os.Stat(filepath.Join(memDir, limitFile)); err != nil {
		limitFile = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(memDir, limitFile), []byte(limit), 0o644); err != nil {
		t.Fatal(err)
	}

	podCfg := c.podConfig("hungry", nil, fmt.Sprintf(`"cgroup_parent":%q,`, podCg))
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	hog := c.runContainer(pod, podCfg, "hog", "sh", "-c", "sleep 1; dd if=/dev/zero of=/dev/shm/fill bs=1M count=512; sleep 1000")
	// The reason can show before the exit has been processed; kubelet
	// removes a pod once its containers have exited, and so does this.
	waitFor(t, func() bool {
		st := c.crictlOK("inspect", hog)
		return strings.Contains(st, `"reason": "OOMKilled"`) && strings.Contains(st, `"state": "CONTAINER_EXITED"`)
	})
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, hog)
}

// Killing the shim: containerd notices, reports the task gone, and runs
// the shim's cleanup: no runsc process, mount, cgroup or network set-up is
// left, for a ctr task and for a pod with its own network.
func TestContainerdShimKilled(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")
	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "busybox:latest", "victim", "sleep", "1000")
	c.killShim("victim")
	waitFor(t, func() bool {
		out := c.ctr("default", "task", "ls")
		return out.code == 0 && !strings.Contains(out.stdout, "RUNNING")
	})
	c.ctr("default", "task", "rm", "-f", "victim")
	c.ctrOK("default", "container", "rm", "victim")
	c.assertClean("victim")

	c.setupCRI()
	c.setShimConfig(`network = "open"`)
	podCfg := c.podConfig("doomed", map[string]string{"dev.hutch.network": "open"}, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	ctr := c.runContainer(pod, podCfg, "sleeper", "sleep", "1000")
	c.killShim(pod)
	waitFor(t, func() bool {
		return strings.Contains(c.crictlOK("pods", "--id", pod), "NotReady") &&
			strings.Contains(c.crictlOK("inspect", ctr), "CONTAINER_EXITED")
	})
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}

// killShim kills the shim process serving task id with SIGKILL.
func (c *ctrd) killShim(id string) {
	c.t.Helper()
	for _, p := range processesMentioning(c.dir) {
		if strings.Contains(p, "containerd-shim-hutch-v1") && strings.Contains(p, "-id "+id+" ") {
			pid, _, _ := strings.Cut(strings.TrimPrefix(p, "process "), ":")
			n, _ := strconv.Atoi(pid)
			if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
				c.t.Fatal(err)
			}
			return
		}
	}
	c.t.Fatalf("no shim process for %s:\n%s", id, strings.Join(processesMentioning(c.dir), "\n"))
}
