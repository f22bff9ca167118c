package shim

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// removeContainerCgroup removes the cgroup a container's spec names, if it
// is still there: runsc removes it when it deletes a container of a live
// sandbox, but not one whose sandbox is already gone (the shim died and
// its containers are cleaned up one by one). Processes left in it are
// killed first. Only cgroupfs paths are handled; the pod's own cgroup,
// which a sandbox may join, is never the container's.
func removeContainerCgroup(s *specs.Spec) error {
	if s == nil || s.Linux == nil || s.Linux.CgroupsPath == "" || strings.Contains(s.Linux.CgroupsPath, ":") {
		return nil
	}
	path := s.Linux.CgroupsPath
	var err error
	for i := 0; i < 25; i++ {
		if err = removeCgroupOnce(path); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", path, err)
}

func removeCgroupOnce(path string) error {
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
