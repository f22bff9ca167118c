package integration

import (
	"fmt"
	"testing"
)

// Stopping a pod right after its container exits works: the stop's kill
// races the exit, and the shim answers it NotFound (as containerd's runc
// shim does), which CRI takes as done, never Unknown. The container exits
// at once or within a few tens of milliseconds, so that the stop lands on
// every side of the exit.
func TestContainerdStopRightAfterExit(t *testing.T) {
	c := newContainerd(t)
	c.setupCRI()
	for i, delay := range []int{0, 0, 5000, 10000, 20000, 30000, 50000} {
		name := fmt.Sprintf("quick%d", i)
		podCfg := c.podConfig(name, nil, "")
		pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
		ctr := c.runContainer(pod, podCfg, "job", "usleep", fmt.Sprint(delay))
		if r := c.crictl("stopp", pod); r.code != 0 {
			t.Fatalf("stopp %d µs after the container's start: %s", delay, r)
		}
		c.crictlOK("rmp", pod)
		c.assertClean(pod, ctr)
	}
}
