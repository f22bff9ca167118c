package policy

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containerd/errdefs"
)

// VolumeSpec is one -v SRC:PATH[:ro|:rw|:overlay] as written: Source is
// a host path, or Volume the name of a named volume; exactly one is set.
// Overlay (host directories only) gives the sandbox a copy-on-write view
// of Source: its writes go to a layer of its own.
type VolumeSpec struct {
	Source   string
	Volume   string
	Target   string
	ReadOnly bool
	Overlay  bool
}

// volumeNameRE leaves the length to CheckVolumeName: a bounded repetition
// is a large compile at every process start.
var volumeNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

// CheckVolumeName validates the name of a named volume: letters, digits,
// '_', '.' and '-', starting with a letter or digit, at most 63 characters.
func CheckVolumeName(name string) error {
	if len(name) > 63 || !volumeNameRE.MatchString(name) {
		return fmt.Errorf("volume name %q: want letters, digits, '_', '.' or '-', starting with a letter or digit, at most 63 characters: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// IsVolumeName reports whether src names a named volume rather than a
// host path: a host path contains a '/' or starts with '.' or '~'.
func IsVolumeName(src string) bool {
	return src != "" && !strings.ContainsRune(src, '/') && src[0] != '.' && src[0] != '~'
}

// ParseVolume parses -v SRC:PATH[:ro|:rw|:overlay]. A relative host path is
// returned as written; the caller makes it absolute or refuses it.
func ParseVolume(s string) (VolumeSpec, error) {
	parts := strings.Split(s, ":")
	bad := func(why string) (VolumeSpec, error) {
		return VolumeSpec{}, fmt.Errorf("-v %q: %s (want SRC:PATH[:ro|:rw|:overlay], SRC a host directory or a volume name): %w", s, why, errdefs.ErrInvalidArgument)
	}
	if len(parts) < 2 || len(parts) > 3 {
		return bad("wrong number of ':'-separated fields")
	}
	v := VolumeSpec{Target: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			v.ReadOnly = true
		case "rw":
		case "overlay":
			v.Overlay = true
		default:
			return bad(fmt.Sprintf("unknown mode %q", parts[2]))
		}
	}
	src := parts[0]
	switch {
	case src == "":
		return bad("empty source")
	case IsVolumeName(src):
		if err := CheckVolumeName(src); err != nil {
			return VolumeSpec{}, err
		}
		if v.Overlay {
			return bad("mode overlay needs a host directory, not a named volume")
		}
		v.Volume = src
	default:
		v.Source = src
	}
	if err := CheckMountTarget(v.Target); err != nil {
		return VolumeSpec{}, err
	}
	return v, nil
}

// reservedTargets are directories of the sandbox a mount may not cover or
// sit inside: the kernel's and hutch's own.
var reservedTargets = []string{"/proc", "/sys", "/dev", "/.hutch", "/run/secrets"}

// CheckMountTarget validates where a mount goes in the sandbox: an
// absolute, clean path other than / and outside /proc, /sys and /dev.
func CheckMountTarget(t string) error {
	if !filepath.IsAbs(t) {
		return fmt.Errorf("mount target %q: not an absolute path: %w", t, errdefs.ErrInvalidArgument)
	}
	if filepath.Clean(t) != t || strings.Contains(t, "/../") {
		return fmt.Errorf("mount target %q: not a clean path (want %q): %w", t, filepath.Clean(t), errdefs.ErrInvalidArgument)
	}
	if t == "/" {
		return fmt.Errorf("mount target /: cannot mount over the sandbox's root: %w", errdefs.ErrInvalidArgument)
	}
	for _, r := range reservedTargets {
		if within(t, r) {
			return fmt.Errorf("mount target %q: %s is reserved: %w", t, r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// systemDirs are host directories no sandbox may mount: sharing them is
// never what a user means, and some would hand the sandbox the host.
var systemDirs = []string{"/", "/proc", "/sys", "/dev", "/boot", "/etc", "/usr", "/var/lib/hutch"}

// CheckHostSource refuses a host directory (already absolute and with
// symlinks resolved) that is a system directory, or is or contains hutch's
// state root (root, also resolved), or lies inside it.
func CheckHostSource(resolved, root string) error {
	for _, d := range systemDirs {
		if resolved == d {
			return fmt.Errorf("host directory %s: a system directory cannot be mounted: %w", resolved, errdefs.ErrInvalidArgument)
		}
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if within(resolved, d) {
			return fmt.Errorf("host directory %s: inside %s, which cannot be mounted: %w", resolved, d, errdefs.ErrInvalidArgument)
		}
	}
	if root != "" && (within(root, resolved) || within(resolved, root)) {
		return fmt.Errorf("host directory %s: it is, contains or lies inside hutch's state root %s; use a named volume instead: %w", resolved, root, errdefs.ErrInvalidArgument)
	}
	return nil
}

// within reports whether path p is dir or lies below it.
func within(p, dir string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}
