package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// probeContainerConfig is a crictl container config running cmd with the
// probe program (integration/probe) mounted at /probe.
func (c *ctrd) probeContainerConfig(name, probe string, cmd ...string) string {
	q := make([]string, len(cmd))
	for i, a := range cmd {
		q[i] = strconv.Quote(a)
	}
	return c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":[%s],"log_path":%q,
"mounts":[{"container_path":"/probe","host_path":%q,"readonly":true}]}`,
		name, criBusyboxImage, strings.Join(q, ","), name+".log", probe))
}

// unescape undoes the quoting of quotes in crictl's error messages.
func unescape(s string) string { return strings.ReplaceAll(s, `\`, "") }

func probeReport(t *testing.T, where, out string) map[string]string {
	t.Helper()
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%s: probe output %q: %v", where, out, err)
	}
	return got
}

// A pod gets the sandbox a CLI sandbox gets: the same seccomp profile
// (every operation the probe tries ends the same way in both, denied
// calls with EPERM) and the same process limit, which holds.
func TestContainerdPodMatchesCLISandbox(t *testing.T) {
	e := newEnv(t)
	probe := buildProbe(t)
	id := e.create("--image", "busybox", "--pids", "32")
	e.copyIn(id, probe, "/probe")
	cli := probeReport(t, "CLI sandbox", e.ok("exec", id, "--", "/probe"))
	// The shell forks short sleepers until it cannot, with builtins
	// only: past the limit nothing else could run.
	// A subshell does it, so that the command itself ends well and
	// crictl shows its output.
	forks := `ulimit -u; (i=0; while [ $i -lt 60 ]; do sleep 3 & i=$((i+1)); echo started $i; done); exit 0`
	cliForks := e.run(nil, "exec", id, "--", "sh", "-c", forks)
	e.ok("rm", "-f", id)

	c := newContainerd(t)
	c.setupCRI()
	podCfg := c.podConfig("probed", map[string]string{"dev.sbx.pids": "32"}, "")
	pod := c.crictlOK("runp", "--runtime", "sbx", podCfg)
	ctr := c.crictlOK("create", pod, c.probeContainerConfig("probe", probe, "sleep", "1000"), podCfg)
	c.crictlOK("start", ctr)
	r := c.crictl("exec", "-s", ctr, "/probe")
	if r.code != 0 {
		t.Fatalf("probe in the pod: %s", r)
	}
	pod1 := probeReport(t, "pod", r.stdout)
	for _, op := range slices.Sorted(maps.Keys(cli)) {
		if pod1[op] != cli[op] {
			t.Errorf("%s: %q in the pod, %q in a CLI sandbox", op, pod1[op], cli[op])
		}
	}
	if cli["unshare_net"] != "EPERM" || cli["bpf"] != "EPERM" {
		t.Fatalf("the CLI sandbox's profile is not in force: %v", cli)
	}

	// The process limit: forks past it fail inside, and the sandbox
	// lives on, in the pod as in the CLI sandbox.
	podForks := c.crictl("exec", "-s", ctr, "sh", "-c", forks)
	for where, f := range map[string]result{"CLI sandbox": cliForks, "pod": podForks} {
		// crictl exec may pass the command's stderr on as stdout.
		out := f.stdout + f.stderr
		lines := strings.Split(out, "\n")
		n := -1
		for _, l := range lines {
			fmt.Sscanf(l, "started %d", &n)
		}
		if lines[0] != "32" || n < 8 || n >= 32 || !strings.Contains(out, "can't fork") {
			t.Errorf("%s: 60 forks under a limit of 32: want ulimit -u 32 and a fork failing before 32, got %s", where, f)
		}
	}
	waitFor(t, func() bool {
		r := c.crictl("exec", "-s", ctr, "echo", "alive")
		return r.code == 0 && strings.Contains(r.stdout, "alive")
	})
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}

// The operator's config is a ceiling: a pod asking for more than it on
// any annotation is refused with a message naming the annotation and the
// ceiling, and leaves nothing; a pod with tightening annotations runs
// tightened.
func TestContainerdPolicyCeiling(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	c.setShimConfig(`network = "open"
allow = ["10.1.0.0/16"]
dns = ["10.1.0.53"]
disk = "2g"
memory = "1g"
cpus = 1
pids = 512`)

	for _, tc := range []struct{ key, value, want string }{
		{"dev.sbx.allow", "169.254.169.254", `annotation dev.sbx.allow="169.254.169.254" exceeds the operator's ceiling: rule 169.254.169.254/32 is not within the operator's network "open" allow list [10.1.0.0/16]`},
		{"dev.sbx.dns", "8.8.8.8", `annotation dev.sbx.dns="8.8.8.8" exceeds the operator's ceiling: server 8.8.8.8 is not one the operator lists [10.1.0.53]`},
		{"dev.sbx.disk", "100t", `annotation dev.sbx.disk="100t" exceeds the operator's ceiling 2GiB`},
		{"dev.sbx.memory", "2g", `annotation dev.sbx.memory="2g" exceeds the operator's ceiling 1GiB`},
		{"dev.sbx.cpus", "2", `annotation dev.sbx.cpus="2" exceeds the operator's ceiling of 1 CPUs`},
		{"dev.sbx.pids", "1000", `annotation dev.sbx.pids="1000" exceeds the operator's ceiling of 512 processes`},
	} {
		name := strings.TrimPrefix(tc.key, "dev.sbx.")
		r := c.crictl("runp", "--runtime", "sbx", c.podConfig("greedy-"+name, map[string]string{tc.key: tc.value}, ""))
		if r.code == 0 || !strings.Contains(unescape(r.stderr), tc.want) {
			t.Errorf("%s=%s: want refused with %q, got %s", tc.key, tc.value, tc.want, r)
		}
	}
	// Network: the operator says open; a pod asking for open when the
	// operator says allow is refused.
	c.setShimConfig(`network = "allow"
allow = ["10.1.0.0/16"]`)
	r := c.crictl("runp", "--runtime", "sbx", c.podConfig("greedy-network", map[string]string{"dev.sbx.network": "open"}, ""))
	if want := `annotation dev.sbx.network="open" exceeds the operator's ceiling network "allow"`; r.code == 0 || !strings.Contains(unescape(r.stderr), want) {
		t.Errorf("network open under allow: want refused with %q, got %s", want, r)
	}
	if out := c.crictlOK("pods", "-q"); out != "" {
		t.Fatalf("refused pods are listed: %q", out)
	}
	c.assertClean()

	// Tightened: network none and fewer processes than the operator's
	// open network and 512.
	c.setShimConfig(`network = "open"
pids = 512`)
	podCfg := c.podConfig("modest", map[string]string{"dev.sbx.network": "none", "dev.sbx.pids": "40", "dev.sbx.memory": "256m"}, "")
	pod := c.crictlOK("runp", "--runtime", "sbx", podCfg)
	ctr := c.runContainer(pod, podCfg, "probe", "sh", "-c", "cat /proc/net/dev; ulimit -u; grep MemTotal /proc/meminfo; echo probe-done; sleep 1000")
	var out string
	waitFor(t, func() bool {
		out = c.crictl("logs", ctr).stdout
		return strings.Contains(out, "probe-done")
	})
	if strings.Contains(out, "eth0") || !strings.Contains(out, "\n40\n") || !strings.Contains(out, strconv.Itoa(256<<10)+" kB") {
		t.Fatalf("a pod asking for network none, 40 processes and 256 MiB sees:\n%s", out)
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, ctr)
}
