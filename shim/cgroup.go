package shim

import (
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
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
	return assembly.RemoveCgroup(s.Linux.CgroupsPath)
}
