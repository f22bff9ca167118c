package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A pod on the host's network (hostNetwork, CRI's namespace mode NODE) is
// refused, saying why; naming hutch's network with dev.hutch.network, it runs.
func TestContainerdHostNetworkRefused(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	c.setShimConfig(`network = "open"`)
	hostPod := c.writeJSON("pod-on-host.json", fmt.Sprintf(`{"metadata":{"name":"on-host","namespace":"default","uid":"on-host-uid"},
"linux":{"security_context":{"namespace_options":{"network":2}}},"log_directory":%q}`, filepath.Join(c.dir, "logs", "on-host")))
	r := c.crictl("runp", "--runtime", "hutch", hostPod)
	want := "the pod asks for the host's network (hostNetwork, no network namespace), which hutch never gives a sandbox"
	if r.code == 0 || !strings.Contains(unescape(r.stderr), want) {
		t.Fatalf("hostNetwork pod: want refused with %q, got %s", want, r)
	}
	if out := c.crictlOK("pods", "-q"); out != "" {
		t.Fatalf("the refused pod is listed: %q", out)
	}
	c.assertClean()

	podCfg := c.podConfig("hutch-net", map[string]string{"dev.hutch.network": "none"}, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	ctr := c.runContainer(pod, podCfg, "quiet", "sh", "-c", "cat /proc/net/dev; echo probe-done; sleep 1000")
	var out string
	waitFor(t, func() bool {
		out = c.crictl("logs", ctr).stdout
		return strings.Contains(out, "probe-done")
	})
	if strings.Contains(out, "eth0") {
		t.Fatalf("a hostNetwork pod naming network none sees an interface:\n%s", out)
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}

// suidProbe is a static program: `suid-probe drop UID PROG ARGS...` sets
// its user ID to UID and runs PROG; `suid-probe euid` prints its
// effective user ID.
const suidProbe = `package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	switch os.Args[1] {
	case "euid":
		fmt.Printf("euid=%d\n", os.Geteuid())
	case "drop":
		uid, _ := strconv.Atoi(os.Args[2])
		if err := syscall.Setuid(uid); err != nil {
			fmt.Println("setuid:", err)
			os.Exit(1)
		}
		err := syscall.Exec(os.Args[3], os.Args[3:], os.Environ())
		fmt.Println("exec:", err)
		os.Exit(1)
	}
}
`

func buildSUIDProbe(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(suidProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module suidprobe\n\ngo 1.21\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "suid-probe")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build suid probe: %v: %s", err, b)
	}
	return out
}

// allowPrivilegeEscalation: a setuid-root binary, made inside the
// container, run by an unprivileged user, elevates only when the operator
// allows setuid (allow_suid) and the container allows escalation
// (no_new_privs false); a container with no_new_privs stays unprivileged.
func TestContainerdPrivilegeEscalation(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	probe := buildSUIDProbe(t)
	// As root: a setuid-root copy of the probe; then as nobody, run it.
	script := "cp /suid-probe /tmp/su-test && chmod 4755 /tmp/su-test && /suid-probe drop 65534 /tmp/su-test euid; echo probe-done; sleep 1000"
	run := func(t *testing.T, name string, noNewPrivs bool) string {
		podCfg := c.podConfig(name, map[string]string{"dev.hutch.network": "none"}, "")
		pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
		ctrCfg := c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":["sh","-c",%q],"log_path":%q,
"mounts":[{"container_path":"/suid-probe","host_path":%q,"readonly":true}],
"linux":{"security_context":{"no_new_privs":%v}}}`, name, criBusyboxImage, script, name+".log", probe, noNewPrivs))
		ctr := c.crictlOK("create", pod, ctrCfg, podCfg)
		c.crictlOK("start", ctr)
		var out string
		waitFor(t, func() bool {
			out = c.crictl("logs", ctr).stdout
			return strings.Contains(out, "probe-done")
		})
		c.crictlOK("rmp", "-f", pod)
		c.assertClean(pod, ctr)
		return out
	}

	c.setShimConfig(`allow_suid = true`)
	if out := run(t, "escalates", false); !strings.Contains(out, "euid=0\n") {
		t.Errorf("no_new_privs false under allow_suid: want the setuid binary to run as root (euid=0), got:\n%s", out)
	}
	if out := run(t, "nnp", true); !strings.Contains(out, "euid=65534\n") {
		t.Errorf("no_new_privs true under allow_suid: want euid=65534, got:\n%s", out)
	}
	c.setShimConfig(``)
	if out := run(t, "no-suid", false); !strings.Contains(out, "euid=65534\n") {
		t.Errorf("no_new_privs false without allow_suid: want euid=65534, got:\n%s", out)
	}
}
