package integration

import (
	"strconv"
	"strings"
	"testing"
)

// unescape undoes the quoting of quotes in crictl's error messages.
func unescape(s string) string { return strings.ReplaceAll(s, `\`, "") }

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
		{"dev.hutch.allow", "169.254.169.254", `annotation dev.hutch.allow="169.254.169.254" exceeds the operator's ceiling: rule 169.254.169.254/32 is not within the operator's network "open" allow list [10.1.0.0/16]`},
		{"dev.hutch.dns", "8.8.8.8", `annotation dev.hutch.dns="8.8.8.8" exceeds the operator's ceiling: server 8.8.8.8 is not one the operator lists [10.1.0.53]`},
		{"dev.hutch.disk", "100t", `annotation dev.hutch.disk="100t" exceeds the operator's ceiling 2GiB`},
		{"dev.hutch.memory", "2g", `annotation dev.hutch.memory="2g" exceeds the operator's ceiling 1GiB`},
		{"dev.hutch.cpus", "2", `annotation dev.hutch.cpus="2" exceeds the operator's ceiling of 1 CPUs`},
		{"dev.hutch.pids", "1000", `annotation dev.hutch.pids="1000" exceeds the operator's ceiling of 512 processes`},
	} {
		name := strings.TrimPrefix(tc.key, "dev.hutch.")
		r := c.crictl("runp", "--runtime", "hutch", c.podConfig("greedy-"+name, map[string]string{tc.key: tc.value}, ""))
		if r.code == 0 || !strings.Contains(unescape(r.stderr), tc.want) {
			t.Errorf("%s=%s: want refused with %q, got %s", tc.key, tc.value, tc.want, r)
		}
	}
	// Network: the operator says open; a pod asking for open when the
	// operator says allow is refused.
	c.setShimConfig(`network = "allow"
allow = ["10.1.0.0/16"]`)
	r := c.crictl("runp", "--runtime", "hutch", c.podConfig("greedy-network", map[string]string{"dev.hutch.network": "open"}, ""))
	if want := `annotation dev.hutch.network="open" exceeds the operator's ceiling network "allow"`; r.code == 0 || !strings.Contains(unescape(r.stderr), want) {
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
	podCfg := c.podConfig("modest", map[string]string{"dev.hutch.network": "none", "dev.hutch.pids": "40", "dev.hutch.memory": "256m"}, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
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
