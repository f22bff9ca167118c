package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// An update of a pod's container (CRI's UpdateContainerResources, crictl
// update) is held to the operator's ceiling as a pod's annotations are:
// CPU and memory above it are refused with a message naming the limit
// and the ceiling; within it, the new limit holds inside the pod, where a
// memory bomb that fits the operator's limit is OOM-killed at the new
// one.
func TestContainerdUpdateCeiling(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	c.setShimConfig("cpus = 1.0\nmemory = \"512m\"")
	// dd fills a buffer of its block size.
	bomb := "dd if=/dev/zero of=/dev/null bs=160M count=1 && echo survived; sleep 1000"

	// The same bomb fits the operator's limit.
	ctlCfg := c.podConfig("control", nil, "")
	ctl := c.crictlOK("runp", "--runtime", "hutch", ctlCfg)
	ctlApp := c.runContainer(ctl, ctlCfg, "app", "sh", "-c", bomb)

	podCfg := c.podConfig("resized", nil, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	// The bomb goes off once the update is in.
	app := c.runContainer(pod, podCfg, "app", "sh", "-c", "until [ -e /tmp/go ]; do sleep 0.1; done; "+bomb)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory", "1073741824"}, "memory limit 1GiB exceeds the operator's ceiling 512MiB"},
		{[]string{"--cpu-period", "100000", "--cpu-quota", "200000"}, "cpu limit 2 CPUs exceeds the operator's ceiling 1 CPUs"},
	} {
		r := c.crictl(append(append([]string{"update"}, tc.args...), app)...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "PermissionDenied") {
			t.Fatalf("update %v above the ceiling: want PermissionDenied with %q, got %s", tc.args, tc.want, r)
		}
	}
	c.crictlOK("update", "--memory", strconv.Itoa(64<<20), app)
	c.crictlOK("exec", "-s", app, "touch", "/tmp/go")

	waitFor(t, func() bool { return strings.Contains(c.crictl("logs", ctlApp).stdout, "survived") })
	waitFor(t, func() bool {
		st := c.crictlOK("inspect", app)
		return strings.Contains(st, `"reason": "OOMKilled"`) && strings.Contains(st, `"state": "CONTAINER_EXITED"`)
	})
	if out := c.crictl("logs", app).stdout; strings.Contains(out, "survived") {
		t.Fatalf("the bomb survived the updated limit: %q", out)
	}
	c.crictlOK("rmp", "-f", pod, ctl)
	c.assertClean(pod, app, ctl, ctlApp)
}

// podMetrics are crictl metricsp's metrics of the pods' containers, by
// container ID, then metric name.
func (c *ctrd) podMetrics() map[string]map[string]uint64 {
	c.t.Helper()
	var out struct {
		PodMetrics []struct {
			ContainerMetrics []struct {
				ContainerID string `json:"containerId"`
				Metrics     []struct {
					Name  string `json:"name"`
					Value struct {
						Value string `json:"value"`
					} `json:"value"`
				} `json:"metrics"`
			} `json:"containerMetrics"`
		} `json:"podMetrics"`
	}
	if err := json.Unmarshal([]byte(c.crictlOK("metricsp", "-o", "json")), &out); err != nil {
		c.t.Fatal(err)
	}
	m := map[string]map[string]uint64{}
	for _, p := range out.PodMetrics {
		for _, cm := range p.ContainerMetrics {
			m[cm.ContainerID] = map[string]uint64{}
			for _, x := range cm.Metrics {
				v, _ := strconv.ParseUint(x.Value.Value, 10, 64)
				m[cm.ContainerID][x.Name] = v
			}
		}
	}
	return m
}

// What kubelet reads of a pod's containers through CRI: a CPU hog in a
// pod with a CPU limit shows CFS throttling; a joined container that
// does nothing has its own memory usage and the pod's memory counters
// (swap, kernel, OOM events); after a memory bomb the sandbox's task
// reports the OOM kill.
func TestContainerdPodStats(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()

	podCfg := c.podConfig("busy", map[string]string{"dev.hutch.cpus": "0.2"}, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	hog := c.runContainer(pod, podCfg, "hog", "sh", "-c", "while :; do :; done")
	idle := c.runContainer(pod, podCfg, "idle", "sleep", "1000")
	var m map[string]map[string]uint64
	waitFor(t, func() bool {
		m = c.podMetrics()
		return m[hog]["container_cpu_cfs_throttled_periods_total"] > 0 && m[hog]["container_cpu_cfs_throttled_seconds_total"] > 0
	})
	for _, name := range []string{"container_memory_usage_bytes", "container_memory_working_set_bytes", "container_memory_kernel_usage"} {
		if m[idle][name] == 0 {
			t.Errorf("joined container: %s is 0: %v", name, m[idle])
		}
	}
	for _, name := range []string{"container_memory_swap", "container_oom_events_total", "container_cpu_cfs_throttled_periods_total"} {
		if _, ok := m[idle][name]; !ok {
			t.Errorf("joined container: no %s: %v", name, m[idle])
		}
	}
	if m[idle]["container_cpu_usage_seconds_total"] >= m[hog]["container_cpu_usage_seconds_total"] && m[hog]["container_cpu_usage_seconds_total"] > 0 {
		t.Errorf("the idle container's CPU usage is the hog's: %v vs %v", m[idle], m[hog])
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod, hog, idle)

	// CRI deletes a sandbox's task once it has exited; ctr keeps it, and
	// its metrics, until it is removed.
	c.importBusybox("default")
	c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "--runtime-config-path", c.shimConfig, "--memory-limit", strconv.Itoa(64<<20), "busybox:latest", "bomb",
		"dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1")
	waitFor(t, func() bool { return strings.Contains(c.ctrOK("default", "task", "ls"), "STOPPED") })
	var st struct {
		OOM struct {
			Kills uint64 `json:"oom_kill"`
		} `json:"memory_oom_control"`
	}
	out := c.ctrOK("default", "task", "metrics", "--format", "json", "bomb")
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.OOM.Kills == 0 {
		t.Fatalf("the OOM-killed sandbox reports no OOM kill (%v): %s", err, out)
	}
	c.ctrOK("default", "task", "rm", "bomb")
	c.ctrOK("default", "container", "rm", "bomb")
	c.assertClean("bomb")
}

// Under kubelet the pod's cgroup exists before its sandbox, and runsc
// sets limits only on cgroups it makes: the host must still hold a pod to
// its own limits (here the dev.hutch.memory annotation, within the
// operator's ceiling). The shim makes the sandbox a cgroup of its own
// below the pod's, with those limits, and removes it with the pod.
func TestContainerdPodCgroupLimits(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	c.setShimConfig(`memory = "512m"`)
	parent := "/hutchtest" + strconv.Itoa(os.Getpid())
	podCg := parent + "/podlimits"
	t.Cleanup(func() {
		for _, d := range []string{podCg, parent} {
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + d)
			for _, dd := range append(dirs, "/sys/fs/cgroup"+d) {
				os.Remove(dd)
			}
		}
	})
	podCfg := c.podConfig("limited", map[string]string{"dev.hutch.memory": "128m"}, fmt.Sprintf(`"cgroup_parent":%q,`, podCg))
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	// The memory cgroup the pod's gVisor sandbox runs in on the host,
	// and the limit the host holds it to.
	var cg string
	for _, p := range processesMentioning(pod) {
		if !strings.Contains(p, "runsc-sandbox") {
			continue
		}
		pid := strings.TrimSuffix(strings.Fields(p)[1], ":")
		b, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		for _, l := range strings.Split(string(b), "\n") {
			// cgroup v1's memory controller, else the unified hierarchy.
			if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[1] == "memory" || f[1] == "" && cg == "") {
				cg = f[2]
			}
		}
	}
	if !strings.HasPrefix(cg, podCg+"/") {
		t.Fatalf("the sandbox runs in cgroup %q, not below the pod's %s", cg, podCg)
	}
	limit, err := os.ReadFile("/sys/fs/cgroup/memory" + cg + "/memory.limit_in_bytes")
	if err != nil {
		limit, err = os.ReadFile("/sys/fs/cgroup" + cg + "/memory.max")
	}
	if err != nil || strings.TrimSpace(string(limit)) != strconv.Itoa(128<<20) {
		t.Fatalf("the sandbox's host cgroup %s is limited to %q (%v), want 128 MiB", cg, limit, err)
	}
	c.crictlOK("rmp", "-f", pod)
	c.assertClean(pod)
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + podCg + "/hutch"); len(dirs) > 0 {
		t.Fatalf("the sandbox's cgroup outlived its pod: %v", dirs)
	}
}
