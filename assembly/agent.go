package assembly

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/agent/wire"
	"hutch.dev/hutch/policy"
)

// AgentMount gives a container the sandbox's agent: the hutch-init binary
// at path, bind-mounted read-only at wire.MountPath (gVisor makes the
// mount point, a file, on the container's root). A mount the spec already
// has there is replaced.
func AgentMount(path string) policy.SpecOpt {
	return func(s *specs.Spec) error {
		s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == wire.MountPath })
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: wire.MountPath, Type: "bind", Source: path,
			Options: []string{"rbind", "ro"},
		})
		return nil
	}
}

// HasAgent reports whether s mounts the agent at wire.MountPath.
func HasAgent(s *specs.Spec) bool {
	return s != nil && slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool {
		return m.Destination == wire.MountPath && m.Type == "bind"
	})
}

// FindAgent locates the hutch-init binary beside the running executable
// (hutch's bin/, or the shim's directory on a node).
func FindAgent() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("hutch-init: locate the running executable: %w", err)
	}
	if r, err := filepath.EvalSymlinks(exe); err == nil {
		exe = r
	}
	return CheckAgent(filepath.Join(filepath.Dir(exe), "hutch-init"))
}

// CheckAgent checks that p names an executable file.
func CheckAgent(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("hutch-init %q: %w: %w", p, errdefs.ErrNotFound, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("hutch-init %q is not an executable file: %w", p, errdefs.ErrInvalidArgument)
	}
	return p, nil
}
