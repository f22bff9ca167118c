package assembly

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// NoSetIDMounts gives every bind mount of a spec runsc.MountNoSetID: no
// file a container writes to a host directory (a pod's hostPath and
// emptyDir volumes) gets a setuid or setgid bit there, which "nosuid"
// alone does not stop.
func NoSetIDMounts() policy.SpecOpt {
	return func(s *specs.Spec) error {
		for i, m := range s.Mounts {
			if m.Type == "bind" && !slices.Contains(m.Options, runsc.MountNoSetID) {
				s.Mounts[i].Options = append(slices.Clip(m.Options), runsc.MountNoSetID)
			}
		}
		return nil
	}
}
