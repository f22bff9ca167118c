package assembly

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// removeCgroup deletes the cgroup at path (a cgroupfs path such as /hutch/ID) in
// every hierarchy it exists in; a missing cgroup is not an error.
// Everything still in it belongs to the sandbox and is killed first; a
// process that is still exiting keeps the cgroup busy for a moment, so the
// delete is retried for up to a second.
func removeCgroup(path string) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = removeOnce(path); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", path, err)
}

func removeOnce(path string) error {
	if cgroups.Mode() == cgroups.Unified {
		m, err := cgroup2.Load(path)
		if err != nil {
			return ignoreGone(err)
		}
		if pids, err := m.Procs(true); err == nil {
			for _, pid := range pids {
				syscall.Kill(int(pid), syscall.SIGKILL) //nolint:errcheck // may be gone
			}
		}
		return ignoreGone(m.Delete())
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(path))
	if err != nil {
		return ignoreGone(err)
	}
	for _, sub := range c.Subsystems() {
		procs, _ := c.Processes(sub.Name(), true)
		for _, p := range procs {
			syscall.Kill(p.Pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		}
	}
	return ignoreGone(c.Delete())
}

func ignoreGone(err error) error {
	if errors.Is(err, cgroup1.ErrCgroupDeleted) || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
