package assembly

import (
	"fmt"
	"path"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
)

// kind is what a path is inside gVisor's own /proc or /sys.
type kind int

const (
	absent kind = iota
	dir
	file
	unknown // a symlink, a process's directory, or deeper than modelled
)

// gvisorTree is what the pinned gVisor's /proc and /sys hold, as far as
// hutch needs to know: each listed directory's entries are all there is.
// /proc's numeric entries (processes) are not listed. Checked inside a
// sandbox by TestContainerdPodMaskedPaths.
var gvisorTree = map[string]map[string]kind{
	"/proc": {
		"bus": dir, "cgroups": file, "cmdline": file, "cpuinfo": file, "devices": file,
		"filesystems": file, "fs": dir, "gvisor": dir, "irq": dir, "loadavg": file,
		"meminfo": file, "modules": file, "mounts": unknown, "net": unknown, "self": unknown,
		"thread-self": unknown, "sentry-meminfo": file, "stat": file, "sys": dir,
		"sysrq-trigger": file, "uptime": file, "version": file,
	},
	"/sys": {
		"block": dir, "bus": dir, "class": dir, "dev": dir, "devices": dir, "firmware": dir,
		"fs": dir, "kernel": dir, "module": dir, "power": dir,
	},
	"/sys/devices":  {"system": dir},
	"/sys/firmware": {},
}

// lookup says what p is inside the sandbox, as far as gvisorTree tells.
func lookup(p string) kind {
	if p == "/proc" || p == "/sys" {
		return dir
	}
	parent, name := path.Split(p)
	parent = strings.TrimSuffix(parent, "/")
	entries, ok := gvisorTree[parent]
	if !ok {
		if k := lookup(parent); k == absent || k == file {
			return absent
		}
		return unknown
	}
	if parent == "/proc" && strings.Trim(name, "0123456789") == "" {
		return unknown
	}
	k, ok := entries[name]
	if !ok {
		return absent
	}
	return k
}

// MaskedPaths enforces a container spec's maskedPaths and readonlyPaths
// inside gVisor, whose runsc ignores both; each is applied or refused,
// never dropped. They name paths in the sandbox's own /proc and /sys,
// which show gVisor's kernel, not the host's:
//   - a masked path gVisor does not have is masked by its absence; a
//     masked directory gets an empty read-only tmpfs over it, a masked
//     file the empty read-only file emptyFile (a host path) bound over it;
//   - a read-only path gVisor does not have needs nothing; one it has
//     makes its whole filesystem (the spec's /proc or /sys mount)
//     read-only, as gVisor cannot bind a directory onto itself.
//
// A path elsewhere (in the image, whose rootfs is not mounted yet), a
// symlink, or a path below what hutch knows of gVisor's tree is refused
// with errdefs.ErrInvalidArgument.
func MaskedPaths(emptyFile string) policy.SpecOpt {
	return func(s *specs.Spec) error {
		if s.Linux == nil {
			return nil
		}
		for _, p := range s.Linux.MaskedPaths {
			k, err := classify("maskedPaths", p)
			if err != nil {
				return err
			}
			switch k {
			case dir:
				if p == "/proc" || p == "/sys" {
					return fmt.Errorf("maskedPaths %s: hutch cannot mask all of %s: %w", p, p, errdefs.ErrInvalidArgument)
				}
				s.Mounts = append(s.Mounts, specs.Mount{Destination: p, Type: "tmpfs", Source: "tmpfs",
					Options: []string{"ro", "nosuid", "nodev", "noexec"}})
			case file:
				s.Mounts = append(s.Mounts, specs.Mount{Destination: p, Type: "bind", Source: emptyFile,
					Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}})
			}
		}
		for _, p := range s.Linux.ReadonlyPaths {
			k, err := classify("readonlyPaths", p)
			if err != nil {
				return err
			}
			if k == absent {
				continue
			}
			fs := "/proc"
			if p == "/sys" || strings.HasPrefix(p, "/sys/") {
				fs = "/sys"
			}
			readOnlyMount(s, fs)
		}
		s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = nil, nil
		return nil
	}
}

// classify is what p (from the spec's list named field) is in the
// sandbox, or an error when hutch cannot tell.
func classify(field, p string) (kind, error) {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return unknown, fmt.Errorf("%s %q: not a clean absolute path: %w", field, p, errdefs.ErrInvalidArgument)
	}
	if p != "/proc" && p != "/sys" && !strings.HasPrefix(p, "/proc/") && !strings.HasPrefix(p, "/sys/") {
		return unknown, fmt.Errorf("%s %s: hutch enforces these only in the sandbox's /proc and /sys, not in the image: %w", field, p, errdefs.ErrInvalidArgument)
	}
	k := lookup(p)
	if k == unknown {
		return unknown, fmt.Errorf("%s %s: hutch cannot tell what this is inside gVisor (a symlink, a process's entry, or deeper than hutch knows), so cannot enforce it: %w", field, p, errdefs.ErrInvalidArgument)
	}
	return k, nil
}

// readOnlyMount makes the spec's mount of fs read-only (adding one where
// the spec has none, as runsc would mount it read-write), for read-only
// path p in it.
func readOnlyMount(s *specs.Spec, fs string) {
	for i := range s.Mounts {
		m := &s.Mounts[i]
		if m.Destination != fs {
			continue
		}
		for _, o := range m.Options {
			if o == "ro" {
				return
			}
		}
		var opts []string
		for _, o := range m.Options {
			if o != "rw" {
				opts = append(opts, o)
			}
		}
		m.Options = append(opts, "ro")
		return
	}
	typ := "proc"
	if fs == "/sys" {
		typ = "sysfs"
	}
	s.Mounts = append(s.Mounts, specs.Mount{Destination: fs, Type: typ, Source: typ,
		Options: []string{"ro", "nosuid", "nodev", "noexec"}})
}
