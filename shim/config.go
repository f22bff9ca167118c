package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/types/known/anypb"
	"hutch.dev/hutch/assembly"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
)

// Annotations the shim reads from a pod's (or a lone container's) OCI spec.
// containerd's CRI passes pod annotations to a runtime only when the
// runtime's pod_annotations list names them: `pod_annotations = ["dev.hutch.*"]`.
const (
	// AnnotationNetwork is the network mode: none, open or allow (see
	// policy.NetworkModes). Unset: the pod's own network namespace if it
	// has one (CNI), else none.
	AnnotationNetwork = "dev.hutch.network"
	// AnnotationAllow lists allow rules, comma-separated: CIDR[:PORT],
	// IP[:PORT], DOMAIN[:PORT] or *.DOMAIN[:PORT].
	AnnotationAllow = "dev.hutch.allow"
	// AnnotationDNS lists upstream resolvers (IPv4), comma-separated.
	AnnotationDNS = "dev.hutch.dns"
	// AnnotationDisk bounds the writable layer of each container of the
	// pod, e.g. "1g".
	AnnotationDisk = "dev.hutch.disk"
	// AnnotationCPUs, AnnotationMemory and AnnotationPids are the pod's
	// limits: CPUs (e.g. "0.5"), memory (e.g. "512m") and processes
	// inside the sandbox.
	AnnotationCPUs   = "dev.hutch.cpus"
	AnnotationMemory = "dev.hutch.memory"
	AnnotationPids   = "dev.hutch.pids"
	// AnnotationEgress, set to EgressPublic on a pod that keeps its own
	// network (CNI), holds it to the egress of a sandbox with network
	// open, enforced on the node (hostnet.PodEgressTable): no private,
	// link-local or metadata address, no other such pod, nothing of the
	// node but DNS to the pod's nameservers.
	AnnotationEgress = "dev.hutch.egress"
	// AnnotationRestore names a checkpoint to restore the pod from: 32
	// lowercase hex digits, the name of a directory below the config's
	// CheckpointDir in the pod's namespace's directory. The pod's
	// sandbox and each of its containers, matched by container name,
	// resume from it instead of starting afresh.
	AnnotationRestore = "dev.hutch.restore"
)

// CRI annotations that say how a container relates to its pod.
const (
	criContainerType = "io.kubernetes.cri.container-type"
	criSandboxID     = "io.kubernetes.cri.sandbox-id"
	criTypeSandbox   = "sandbox"
	criTypeContainer = "container"
	// criSandboxNamespace is the pod's Kubernetes namespace and
	// criContainerName the container's name in its pod.
	criSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	criContainerName    = "io.kubernetes.cri.container-name"
)

// DefaultCheckpointDir is the default CheckpointDir.
const DefaultCheckpointDir = "/var/lib/hutch/checkpoints"

// DefaultConfigPath is read when containerd passes no runtime options.
const DefaultConfigPath = "/etc/hutch/containerd-shim-hutch-v1.toml"

// Config is the runtime options file (ConfigPath in containerd's runtime
// options, TOML). Every field has a default.
type Config struct {
	// Runsc is the runsc binary; default: runsc beside the shim binary,
	// else the one on PATH.
	Runsc string `toml:"runsc"`
	// HutchInit is the hutch-init binary, mounted read-only into every
	// container of a pod at /.hutch/hutch-init: an exec with a terminal runs
	// through it on a pty of the sandbox's own devpts. Default: hutch-init
	// beside the shim binary; when there is none, such an exec gets a
	// pty of the host's instead.
	HutchInit string `toml:"hutch_init"`
	// RunscRoot is runsc's state directory; a directory per containerd
	// namespace is made below it. Default /run/hutch/containerd.
	RunscRoot string `toml:"runsc_root"`
	// Platform is gVisor's platform (default systrap).
	Platform string `toml:"platform"`
	// DebugLogDir, if set, receives runsc's debug logs.
	DebugLogDir string `toml:"debug_log_dir"`
	// Network, Allow, DNS, Disk, CPUs, Memory and Pids are the policy
	// of pods that do not set the matching annotation, and the ceiling
	// of those that do: an annotation may only tighten them (see
	// resolvePolicy). Unset, they are hutch's defaults (network none, or
	// the pod's own network namespace when it has one).
	Network string   `toml:"network"`
	Allow   []string `toml:"allow"`
	DNS     []string `toml:"dns"`
	Disk    string   `toml:"disk"`
	CPUs    float64  `toml:"cpus"`
	Memory  string   `toml:"memory"`
	Pids    int64    `toml:"pids"`
	// Egress, "public", holds every pod that keeps its own network to
	// public egress (AnnotationEgress), whatever its annotations say.
	Egress string `toml:"egress"`
	// AllowSUID lets setuid and setgid binaries raise a process's
	// privileges inside the pod's sandbox (runsc --allow-suid), for
	// containers that allow privilege escalation (Kubernetes'
	// allowPrivilegeEscalation, unset or true: the spec's
	// noNewPrivileges false); a container with noNewPrivileges keeps
	// it, as gVisor honours it per process. Default false: no setuid
	// binary elevates in any pod. A pod cannot raise it.
	AllowSUID bool `toml:"allow_suid"`
	// CheckpointDir holds the checkpoints pods can be restored from
	// (AnnotationRestore): CheckpointDir/NAMESPACE/NAME, one directory
	// per checkpoint, as a checkpoint through containerd's task API
	// with that image path writes it. Default DefaultCheckpointDir.
	CheckpointDir string `toml:"checkpoint_dir"`
}

// loadConfig reads the runtime options containerd passed with a create:
// runtimeoptions.Options with a ConfigPath (or ConfigBody, the inline TOML
// of CRI's options table). With none, DefaultConfigPath if it exists.
func loadConfig(opts *anypb.Any) (Config, error) {
	var c Config
	var body []byte
	path := ""
	if opts != nil && len(opts.GetValue()) > 0 {
		v, err := typeurl.UnmarshalAny(opts)
		if err != nil {
			return c, fmt.Errorf("runtime options: %w", err)
		}
		ro, ok := v.(*runtimeoptions.Options)
		if !ok {
			return c, fmt.Errorf("runtime options: %T: %w (want runtimeoptions.v1.Options with a ConfigPath)", v, errdefs.ErrInvalidArgument)
		}
		path, body = ro.ConfigPath, ro.ConfigBody
	}
	if path == "" && len(body) == 0 {
		if _, err := os.Stat(DefaultConfigPath); err == nil {
			path = DefaultConfigPath
		}
	}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("runtime config: %w", err)
		}
		body = b
	}
	if len(body) > 0 {
		d := toml.NewDecoder(strings.NewReader(string(body)))
		if path != "" {
			// A file is ours alone: a misspelt key is an error. CRI's
			// inline body also carries containerd's own keys.
			d.DisallowUnknownFields()
		}
		if err := d.Decode(&c); err != nil {
			var strict *toml.StrictMissingError
			if errors.As(err, &strict) {
				// Name the unknown keys, not only that there are some.
				err = fmt.Errorf("unknown keys:\n%s", strict.String())
			}
			return c, fmt.Errorf("runtime config %s: %w: %w", path, errdefs.ErrInvalidArgument, err)
		}
	}
	if c.Runsc == "" {
		// Found as hutch finds it; else by name, on $PATH when it runs.
		c.Runsc = "runsc"
		if p, err := assembly.FindRunsc(); err == nil {
			c.Runsc = p
		}
	}
	if c.HutchInit != "" {
		p, err := filepath.Abs(c.HutchInit)
		if err == nil {
			p, err = assembly.CheckAgent(p)
		}
		if err != nil {
			return c, fmt.Errorf("runtime config %s: hutch_init: %w", path, err)
		}
		c.HutchInit = p
	}
	if c.RunscRoot == "" {
		c.RunscRoot = "/run/hutch/containerd"
	}
	if c.CheckpointDir == "" {
		c.CheckpointDir = DefaultCheckpointDir
	} else if !filepath.IsAbs(c.CheckpointDir) {
		return c, fmt.Errorf("runtime config %s: checkpoint_dir %q: %w: want an absolute path", path, c.CheckpointDir, errdefs.ErrInvalidArgument)
	}
	return c, nil
}
