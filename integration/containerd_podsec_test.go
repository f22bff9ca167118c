package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// threadProbe starts a thread through glibc's pthread_create, which tries
// clone3 first and falls back to clone only when clone3 fails with
// ENOSYS: what Kubernetes' RuntimeDefault profile (containerd's) asks of
// clone3.
const threadProbe = `#include <pthread.h>
#include <stdio.h>
#include <string.h>
static void *run(void *arg) { return arg; }
int main(void) {
	pthread_t t;
	int err = pthread_create(&t, NULL, run, NULL);
	if (err != 0) { printf("thread: %s\n", strerror(err)); return 1; }
	pthread_join(t, NULL);
	printf("thread: ok\n");
	return 0;
}
`

func buildThreadProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "thread.c")
	if err := os.WriteFile(src, []byte(threadProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "thread-probe")
	if b, err := exec.Command("gcc", "-static", "-pthread", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("build thread probe (gcc with static glibc): %v: %s", err, b)
	}
	return out
}

// podSecContainer writes a crictl container config running script with
// the given seccomp profile ("" for none: Unconfined), the capabilities
// added, and the thread probe mounted at /thread-probe.
func (c *ctrd) podSecContainer(name, seccomp, script, probe string, caps ...string) string {
	sc := ""
	if seccomp != "" {
		sc = fmt.Sprintf(`"seccomp":%s,`, seccomp)
	}
	q := make([]string, len(caps))
	for i, cp := range caps {
		q[i] = fmt.Sprintf("%q", cp)
	}
	return c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":["sh","-c",%q],"log_path":%q,
"mounts":[{"container_path":"/thread-probe","host_path":%q,"readonly":true}],
"linux":{"security_context":{%s"capabilities":{"add_capabilities":[%s]}}}}`,
		name, criBusyboxImage, script+"; echo probe-done; sleep 1000", name+".log", probe, sc, strings.Join(q, ",")))
}

// A container's own seccomp profile applies on top of hutch's: a call runs
// only if both allow it. A Localhost profile that denies sethostname
// denies it (to a container holding CAP_SYS_ADMIN, which could otherwise
// set it), and hutch's own denials hold under it; RuntimeDefault runs a
// threaded glibc program; a profile gVisor cannot enforce is refused at
// create with the reason.
func TestContainerdPodSeccomp(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	probe := buildThreadProbe(t)
	denyHost := c.writeJSON("deny-sethostname.json", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["sethostname"],"action":"SCMP_ACT_ERRNO"}]}`)
	notify := c.writeJSON("notify.json", `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_NOTIFY"}]}`)

	script := "hostname pod-renamed; echo sethostname=$?; unshare -n true; echo unshare=$?; /thread-probe"
	podCfg := c.podConfig("podsec", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	run := func(name, seccomp string, caps ...string) string {
		t.Helper()
		id := c.crictlOK("create", pod, c.podSecContainer(name, seccomp, script, probe, caps...), podCfg)
		c.crictlOK("start", id)
		var out string
		waitFor(t, func() bool {
			r := c.crictl("logs", id)
			out = r.stdout + r.stderr
			return strings.Contains(out, "probe-done")
		})
		return out
	}

	// The probe can tell: with no profile of its own, the container
	// (CAP_SYS_ADMIN) sets the hostname; hutch's profile still denies
	// unshare(CLONE_NEWNET).
	out := run("unconfined", "", "SYS_ADMIN")
	if !strings.Contains(out, "sethostname=0") || !strings.Contains(out, "unshare=1") || !strings.Contains(out, "thread: ok") {
		t.Fatalf("unconfined container: want sethostname to succeed, unshare denied, threads to start:\n%s", out)
	}

	out = run("localhost", fmt.Sprintf(`{"profile_type":2,"localhost_ref":%q}`, denyHost), "SYS_ADMIN")
	if !strings.Contains(out, "sethostname=1") || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("Localhost profile denying sethostname: want EPERM, got:\n%s", out)
	}
	if !strings.Contains(out, "unshare=1") || !strings.Contains(out, "unshare(0x40000000): Operation not permitted") {
		t.Errorf("Localhost profile: want hutch's denial of unshare(CLONE_NEWNET) to hold (EPERM), got:\n%s", out)
	}

	// Without CAP_SYS_ADMIN, RuntimeDefault denies clone3 with ENOSYS.
	out = run("runtime-default", `{"profile_type":0}`)
	if !strings.Contains(out, "thread: ok") {
		t.Errorf("RuntimeDefault: want a glibc program to start a thread (clone3 denied with ENOSYS, then clone), got:\n%s", out)
	}
	if !strings.Contains(out, "unshare=1") {
		t.Errorf("RuntimeDefault: want unshare(CLONE_NEWNET) denied, got:\n%s", out)
	}

	// CRI creates the task, where the shim sees the spec, at start.
	id := c.crictlOK("create", pod, c.podSecContainer("notify", fmt.Sprintf(`{"profile_type":2,"localhost_ref":%q}`, notify), "true", probe), podCfg)
	if r := c.crictl("start", id); r.code == 0 || !strings.Contains(r.stderr, "gVisor has no seccomp user notification") {
		t.Errorf("a SCMP_ACT_NOTIFY profile: want start refused naming the reason, got: %s", r)
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod)
}

// maskedPaths and readonlyPaths (kubelet's defaults for procMount
// Default, and a masked file gVisor has) hold inside gVisor: each masked
// path shows nothing, and /proc/sys cannot be written, as on runc.
func TestContainerdPodMaskedPaths(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	masked := []string{"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/sys/firmware", "/sys/devices/virtual/powercap", "/proc/scsi", "/proc/cgroups"}
	readonly := []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
	var script []string
	for _, p := range masked {
		// A masked path is absent, an empty directory, or an empty file.
		script = append(script, fmt.Sprintf(`if [ -d %[1]s ]; then echo "masked %[1]s dir:$(ls -A %[1]s | wc -l)"; elif [ -e %[1]s ]; then echo "masked %[1]s file:$(cat %[1]s | wc -c)"; else echo "masked %[1]s absent"; fi`, p))
	}
	script = append(script,
		"touch /sys/firmware/x 2>/dev/null; echo firmware-write=$?",
		"cat /proc/sys/fs/nr_open >/dev/null; echo sys-read=$?",
		"echo 1024 > /proc/sys/fs/nr_open; echo sys-write=$?",
		"echo 1 > /proc/sys/net/ipv4/tcp_sack; echo net-write=$?",
		"mkdir /proc/fs/x; echo fs-mkdir=$?",
		"echo b > /proc/sysrq-trigger; echo sysrq-write=$?")
	podCfg := c.podConfig("masked", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	list := func(ps []string) string {
		q := make([]string, len(ps))
		for i, p := range ps {
			q[i] = fmt.Sprintf("%q", p)
		}
		return strings.Join(q, ",")
	}
	cfg := c.writeJSON("ctr-masked.json", fmt.Sprintf(`{"metadata":{"name":"probe"},"image":{"image":%q},"command":["sh","-c",%q],"log_path":"probe.log",
"linux":{"security_context":{"masked_paths":[%s],"readonly_paths":[%s]}}}`,
		criBusyboxImage, strings.Join(script, "; ")+"; echo probe-done; sleep 1000", list(masked), list(readonly)))
	ctr := c.crictlOK("create", pod, cfg, podCfg)
	c.crictlOK("start", ctr)
	var out string
	waitFor(t, func() bool {
		r := c.crictl("logs", ctr)
		out = r.stdout + r.stderr
		return strings.Contains(out, "probe-done")
	})
	for _, p := range masked {
		if !strings.Contains(out, "masked "+p+" absent") && !strings.Contains(out, "masked "+p+" dir:0") && !strings.Contains(out, "masked "+p+" file:0") {
			t.Errorf("masked path %s shows something:\n%s", p, out)
		}
	}
	for _, want := range []string{"firmware-write=1", "sys-read=0", "sys-write=1", "net-write=1", "fs-mkdir=1", "sysrq-write=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %s:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "/proc/sys/fs/nr_open: Read-only file system") {
		t.Errorf("writing /proc/sys: want EROFS:\n%s", out)
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}
