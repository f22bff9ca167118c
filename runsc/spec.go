package runsc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// DefaultCapabilities is the capability set of a sandbox's processes: the
// set a Docker container gets, so that package managers work as root inside.
// They are capabilities within gVisor's kernel, not the host's.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// AllCapabilities is every capability gVisor's kernel knows: those of a
// Docker sandbox's init and root processes (dockerd and runc need them
// all, as on a host). They are capabilities within gVisor's kernel, not
// the host's.
var AllCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
	"CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON",
	"CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// Options of a bind mount that the pinned runsc's gofer filesystem takes
// (tools/runsc/hostfiles.patch). They decide what a sandbox, root inside
// included, can leave on a host directory that other host users reach.
const (
	// MountNoSetID drops setuid and setgid bits from every file the
	// sandbox creates or chmods on the mount. ("nosuid" only stops the
	// sandbox honouring them; the host would still run them.)
	MountNoSetID = "nosetid"
	// MountOwnerFromParent makes a file the sandbox creates belong to the
	// owner and group of its directory on the host, whoever creates it,
	// and refuses a change of owner or group with EPERM.
	MountOwnerFromParent = "owner_from_parent"
)

// SpecConfig describes the sandbox that Spec renders. The caller owns every
// path in it.
type SpecConfig struct {
	// Rootfs is the root filesystem directory. gVisor's overlay takes the
	// sandbox's writes, so it may be shared read-only between sandboxes.
	Rootfs string
	// Hostname inside the sandbox.
	Hostname string
	// Process is the sandbox's init.
	Process specs.Process
	// Mounts are added after the default ones (/proc, /dev, /sys, ...).
	Mounts []specs.Mount
	// NetworkNamespace is the path of an existing network namespace to
	// run in (runsc --network=sandbox takes over its interfaces); empty
	// means a new, empty one.
	NetworkNamespace string
	// UserNamespace maps HostUID/HostGID to root inside, for a sandbox
	// started by an unprivileged user (rootless).
	UserNamespace    bool
	HostUID, HostGID uint32
	// CgroupsPath and Resources, when set, put the sandbox in that cgroup
	// with those limits.
	CgroupsPath string
	Resources   *specs.LinuxResources
	// Annotations are copied into the spec.
	Annotations map[string]string
}

// Spec renders c as an OCI runtime spec for runsc.
func Spec(c SpecConfig) *specs.Spec {
	s := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: c.Rootfs},
		Hostname: c.Hostname,
		Process:  &c.Process,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Annotations: c.Annotations,
		Linux: &specs.Linux{
			CgroupsPath: c.CgroupsPath,
			Resources:   c.Resources,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: c.NetworkNamespace},
			},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	s.Mounts = append(s.Mounts, c.Mounts...)
	if s.Process.Capabilities == nil {
		caps := append([]string(nil), DefaultCapabilities...)
		s.Process.Capabilities = &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps,
		}
	}
	if c.UserNamespace {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.HostUID, Size: 1}}
		s.Linux.GIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: c.HostGID, Size: 1}}
	}
	return s
}

// ReadBundle reads bundle/config.json, the spec a bundle runs.
func ReadBundle(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(bundle, "config.json"), err)
	}
	return &s, nil
}

// WriteBundle writes s as bundle/config.json, readable by its owner only:
// a spec can carry environment values that others must not read.
func WriteBundle(bundle string, s *specs.Spec) error {
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return err
	}
	tmp := filepath.Join(bundle, ".config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(bundle, "config.json"))
}
