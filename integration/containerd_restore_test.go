package integration

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// restorePodConfig writes a CRI pod config in namespace ns on hutch's own
// network (open: an address of its own), naming the checkpoint restore with dev.hutch.restore
// unless it is "".
func (c *ctrd) restorePodConfig(name, ns, restore string) string {
	ann := `"dev.hutch.network":"open"`
	if restore != "" {
		ann += fmt.Sprintf(`,"dev.hutch.restore":%q`, restore)
	}
	return c.writeJSON("pod-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q,"namespace":%q,"uid":%q},
"linux":{"security_context":{"namespace_options":{"network":2}}},"log_directory":%q,"annotations":{%s}}`,
		name, ns, name+"-uid", filepath.Join(c.dir, "logs", name), ann))
}

// counterScript leaves a mark of its own start in the container's root
// filesystem and in /tmp (once: a restored container keeps its own), then
// counts into /tmp/count every 100 ms, logging every tenth count.
const counterScript = `[ -e /etc/marker ] || echo "start-$$-$(date +%s%N)" > /etc/marker
[ -e /tmp/keep ] || cp /etc/marker /tmp/keep
i=0; while true; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count
[ $((i % 10)) = 0 ] && echo "count $i"; sleep 0.1; done`

// A pod is checkpointed through containerd's task API into the node's
// checkpoint directory and a new pod of the same namespace, naming the
// checkpoint with dev.hutch.restore, continues where it stopped: its
// counter goes on from past the checkpointed value, its root filesystem
// and /tmp changes are there, its address is its new pod's, exec, logs
// and stats work; a container the
// checkpoint does not hold is refused until the checkpoint's containers
// are restored, then runs; the restored pod checkpoints and restores
// again; a container restarted in it starts afresh; removal leaves
// nothing. A pod of another namespace, or naming a
// checkpoint by anything but its name, is refused saying so, and leaves
// nothing.
func TestPodCheckpointRestore(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	ckdir := filepath.Join(c.dir, "checkpoints")
	c.setShimConfig(fmt.Sprintf("checkpoint_dir = %q\nnetwork = \"open\"", ckdir))
	newName := func() string {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(b)
	}

	read := func(ctr, file string) string {
		t.Helper()
		return c.crictlOK("exec", "-s", ctr, "cat", file)
	}
	// addr is the address of the container's pod on its interface.
	addr := func(ctr string) string {
		t.Helper()
		out := c.crictlOK("exec", "-s", ctr, "ip", "-4", "addr", "show", "eth0")
		for _, f := range strings.Fields(out) {
			if a, _, ok := strings.Cut(f, "/"); ok && strings.Count(a, ".") == 3 {
				return a
			}
		}
		t.Fatalf("no address on eth0 of %s:\n%s", ctr, out)
		return ""
	}
	count := func(ctr string) int {
		t.Helper()
		out := read(ctr, "/tmp/count")
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("counter of %s: %q", ctr, out)
		}
		return n
	}
	// checkpoint checkpoints the pod into the node's checkpoint
	// directory as name, ending it, and removes it.
	checkpoint := func(pod, ctr, name string) {
		t.Helper()
		image := filepath.Join(ckdir, "default", name)
		c.ctrOK("k8s.io", "tasks", "checkpoint", "--exit", "--image-path", image, pod)
		if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); err != nil {
			t.Fatalf("checkpoint directory: %v", err)
		}
		waitFor(t, func() bool { return strings.Contains(c.crictlOK("inspect", ctr), `"state": "CONTAINER_EXITED"`) })
		// containerd's client (ctr) records a checkpoint image for
		// runtimes other than runc's (the pause image and its empty
		// writable layer); the runtime's checkpoint stays in image.
		for _, ref := range strings.Fields(c.ctrOK("k8s.io", "images", "ls", "-q", `labels."containerd.io/checkpoint"==true`)) {
			c.ctrOK("k8s.io", "images", "rm", "--sync", ref)
		}
		c.crictlOK("rmp", "-f", pod)
		c.assertClean(pod, ctr)
	}

	podA := c.restorePodConfig("saver", "default", "")
	a := c.crictlOK("runp", "--runtime", "hutch", podA)
	ctrA := c.runContainer(a, podA, "sandbox", "sh", "-c", counterScript)
	waitFor(t, func() bool {
		return c.crictl("exec", "-s", ctrA, "test", "-s", "/tmp/count").code == 0
	})
	waitFor(t, func() bool { return count(ctrA) >= 20 })
	marker := read(ctrA, "/etc/marker")
	if keep := read(ctrA, "/tmp/keep"); keep != marker || !strings.HasPrefix(marker, "start-") {
		t.Fatalf("pod A: marker %q, /tmp/keep %q", marker, keep)
	}
	before := count(ctrA)
	addrA := addr(ctrA)
	name := newName()
	checkpoint(a, ctrA, name)

	// Refused: another namespace's pod naming the checkpoint, a name
	// that is a path or not lowercase, a name with no checkpoint.
	for i, tc := range []struct{ ns, restore, want string }{
		{"other", name, "annotation dev.hutch.restore=" + name + ": no checkpoint of that name in namespace other on this node"},
		{"default", "../default/" + name, "annotation dev.hutch.restore=\"../default/" + name + "\": a checkpoint name is 32 lowercase hex digits"},
		{"default", strings.ToUpper(name), "a checkpoint name is 32 lowercase hex digits"},
		{"default", strings.Repeat("0", 32), "no checkpoint of that name in namespace default on this node"},
	} {
		cfg := c.restorePodConfig(fmt.Sprintf("refused-%d", i), tc.ns, tc.restore)
		r := c.crictl("runp", "--runtime", "hutch", cfg)
		if r.code == 0 || !strings.Contains(unescape(r.stderr), unescape(tc.want)) {
			t.Fatalf("pod in %s restoring %q: want refused with %q, got %s", tc.ns, tc.restore, tc.want, r)
		}
		if out := c.crictlOK("pods", "-q"); out != "" {
			t.Fatalf("the refused pod is listed: %q", out)
		}
		c.assertClean()
	}

	// restore runs a pod named podName restoring checkpoint name, runs
	// setup in it, then the same container as pod A's and others (the
	// rest of the checkpoint's containers: the restored sandbox resumes
	// once it has them all), and checks it goes on from past count0.
	restore := func(podName, name string, count0 int, setup, others func(pod, podCfg string)) (pod, podCfg, ctr string) {
		t.Helper()
		podCfg = c.restorePodConfig(podName, "default", name)
		pod = c.crictlOK("runp", "--runtime", "hutch", podCfg)
		if setup != nil {
			setup(pod, podCfg)
		}
		ctr = c.runContainer(pod, podCfg, "sandbox", "sh", "-c", counterScript)
		if others != nil {
			others(pod, podCfg)
		}
		first := count(ctr)
		if first < count0 {
			t.Fatalf("restored counter is at %d, checkpointed past %d: it started afresh", first, count0)
		}
		waitFor(t, func() bool { return count(ctr) >= first+5 })
		if got := read(ctr, "/etc/marker"); got != marker {
			t.Fatalf("root filesystem change: /etc/marker is %q, was %q before the checkpoint", got, marker)
		}
		if got := read(ctr, "/tmp/keep"); got != marker {
			t.Fatalf("/tmp/keep is %q, was %q before the checkpoint", got, marker)
		}
		// Its output reaches the new container's log.
		waitFor(t, func() bool {
			for _, l := range strings.Split(c.crictl("logs", ctr).stdout, "\n") {
				if n, err := strconv.Atoi(strings.TrimPrefix(l, "count ")); err == nil && n > count0 {
					return true
				}
			}
			return false
		})
		if out := c.crictlOK("stats", "-o", "json", ctr); !strings.Contains(out, "workingSetBytes") {
			t.Fatalf("stats of the restored container: %s", out)
		}
		return pod, podCfg, ctr
	}

	// A pod that takes pod A's freed address: the restored pod gets
	// another one.
	fillerCfg := c.restorePodConfig("filler", "default", "")
	filler := c.crictlOK("runp", "--runtime", "hutch", fillerCfg)

	// A container the checkpoint does not hold starts only once the
	// checkpoint's containers are restored: before, it is refused.
	late := func(pod, podCfg string, attempt int) result {
		cfg := c.writeJSON(fmt.Sprintf("ctr-late-%d.json", attempt), fmt.Sprintf(`{"metadata":{"name":"late","attempt":%d},"image":{"image":%q},"command":["sleep","1000"],"log_path":"late-%d.log"}`,
			attempt, criBusyboxImage, attempt))
		return c.crictl("start", c.crictlOK("create", pod, cfg, podCfg))
	}
	b, _, ctrB := restore("resumer", name, before, func(pod, podCfg string) {
		want := `container "late": the pod's checkpoint (annotation dev.hutch.restore=` + name + `) holds no container of that name, and it starts only once the checkpoint's containers are restored; not yet restored: sandbox`
		if r := late(pod, podCfg, 0); r.code == 0 || !strings.Contains(unescape(r.stderr), unescape(want)) {
			t.Fatalf("a container not in the checkpoint, before the restore: want refused with %q, got %s", want, r)
		}
	}, nil)
	if r := late(b, c.restorePodConfig("resumer", "default", name), 1); r.code != 0 {
		t.Fatalf("a container not in the checkpoint, after the restore: %s", r)
	}
	// The restored pod's network is its own pod's, not the checkpointed one's.
	if got := addr(ctrB); got == addrA {
		t.Fatalf("restored pod has the checkpointed pod's address %s", got)
	}
	c.crictlOK("rmp", "-f", filler)
	// Restored pods checkpoint and restore again.
	before = count(ctrB)
	name2 := newName()
	checkpoint(b, ctrB, name2)
	pc, podCfgC, ctrC := restore("resumer-again", name2, before, nil, func(pod, podCfg string) {
		if r := late(pod, podCfg, 0); r.code != 0 {
			t.Fatalf("restoring the checkpoint's second container: %s", r)
		}
	})

	// A restart of the container (kubelet's next attempt) starts afresh.
	c.crictlOK("stop", ctrC)
	if out := c.crictlOK("inspect", ctrC); !strings.Contains(out, `"state": "CONTAINER_EXITED"`) {
		t.Fatalf("stopped restored container is not exited:\n%s", out)
	}
	again := c.writeJSON("ctr-again.json", fmt.Sprintf(`{"metadata":{"name":"sandbox","attempt":1},"image":{"image":%q},"command":["sh","-c",%q],"log_path":"again.log"}`,
		criBusyboxImage, counterScript))
	ctrD := c.crictlOK("create", pc, again, podCfgC)
	c.crictlOK("start", ctrD)
	waitFor(t, func() bool {
		return c.crictl("exec", "-s", ctrD, "test", "-s", "/tmp/count").code == 0
	})
	if n := count(ctrD); n >= before {
		t.Fatalf("restarted container's counter is at %d: it did not start afresh", n)
	}
	if got := read(ctrD, "/etc/marker"); got == marker {
		t.Fatalf("restarted container has the checkpoint's root filesystem (marker %q)", got)
	}
	c.crictlOK("rmp", "-f", pc)
	c.assertClean(pc, ctrC, ctrD, filler)
	// The checkpoints are the node's to delete, not the shim's.
	for _, n := range []string{name, name2} {
		if _, err := os.Stat(filepath.Join(ckdir, "default", n, "checkpoint.img")); err != nil {
			t.Fatalf("checkpoint removed with the pod: %v", err)
		}
	}
}
