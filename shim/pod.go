package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
	"hutch.dev/hutch/runsc"
)

// pod is one gVisor sandbox: the runsc configuration every container of
// the pod shares, and the host network set-up the pod's policy asked for.
type pod struct {
	id     string // the sandbox container's ID, also runsc's sandbox ID
	policy podPolicy
	r      *runsc.Runsc
	// stateDir holds the pod's resolver files; removed with the pod.
	stateDir string
	// linked is true when the shim set up a netns, veth and firewall;
	// resolver is the pod's DNS resolver, served by the shim, and
	// netMounts give its containers the resolv.conf naming it.
	linked    bool
	resolver  *assembly.ResolverHandle
	netMounts []specs.Mount
	// cgroupsPath is the sandbox's cgroup as the spec names it.
	cgroupsPath string
	// ownCgroup is the cgroup the shim made for the sandbox below the
	// pod's, if any: the shim removes it.
	ownCgroup string
	// oomCgroup is the cgroup the sandbox runs in (the pod's), and
	// oomBase its OOM kill count when the sandbox started.
	oomCgroup  string
	oomBase    uint64
	sandboxPid int
	// gone is closed when the sandbox process has exited.
	gone chan struct{}
	// agent is the hutch-init binary mounted into each container, for
	// terminals of the sandbox's own; "" if there is none.
	agent string
	// restore is the checkpoint the pod resumes from (AnnotationRestore),
	// "" if none; restored are the names of its containers restored
	// from it so far (guarded by service.mu).
	restore  string
	restored map[string]bool
	// egress is the pod's entry in the node's egress table, when its
	// policy holds its own network to public egress (holdEgress).
	egress *assembly.PodEgress
}

// record is what the shim leaves in each container's bundle so that
// `containerd-shim-hutch-v1 delete`, run after the shim died, can clean up.
type record struct {
	SandboxID string      `json:"sandbox_id"`
	Root      bool        `json:"root"`
	Runsc     runsc.Runsc `json:"runsc"`
	Linked    bool        `json:"linked"`
	StateDir  string      `json:"state_dir"`
	// Cgroup is the cgroup the shim made for a pod's sandbox below the
	// pod's (ownPodCgroup), removed with the pod.
	Cgroup string `json:"cgroup,omitempty"`
	// Egress is the pod's entry in the node's egress table, released
	// with the pod.
	Egress *assembly.PodEgress `json:"egress,omitempty"`
}

const recordFile = "hutch-shim.json"

func writeRecord(bundle string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, recordFile), b, 0o600)
}

func readRecord(bundle string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(bundle, recordFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", recordFile, err)
	}
	return &r, nil
}

// newPod renders the runsc configuration of a new sandbox and sets up its
// network as the policy says. spec is the sandbox container's spec; it is
// changed to use the pod's network namespace. On error nothing is left.
func newPod(ctx context.Context, ns, id string, cfg Config, spec *specs.Spec) (_ *pod, err error) {
	hasNetns := netnsPath(spec) != ""
	pp, err := resolvePolicy(cfg, spec, hasNetns)
	if err != nil {
		return nil, err
	}
	if err := checkHostNetwork(spec); err != nil {
		return nil, err
	}
	p := &pod{id: id, policy: pp, gone: make(chan struct{}), agent: cfg.HutchInit}
	if p.agent == "" {
		if a, err := assembly.FindAgent(); err == nil {
			p.agent = a
		} else {
			log.G(ctx).WithError(err).WithField("id", id).Warn("no hutch-init for the pod: an exec with a terminal gets a host pty instead of one of the sandbox's devpts")
		}
	}
	p.r = assembly.Runsc(assembly.RunscConfig{
		Path:        cfg.Runsc,
		Root:        filepath.Join(cfg.RunscRoot, ns),
		Platform:    cfg.Platform,
		DebugLogDir: cfg.DebugLogDir,
		Linked:      pp.Network != policy.NetNone,
		Disk:        pp.Disk,
		AllowSUID:   cfg.AllowSUID,
	})
	p.stateDir = filepath.Join(cfg.RunscRoot, ns, "hutch", id)
	if err := os.MkdirAll(p.stateDir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.teardown(context.Background())
		}
	}()
	if spec.Linux != nil {
		p.cgroupsPath = spec.Linux.CgroupsPath
	}

	switch pp.Network {
	case "":
		// Kubernetes' own pod network (CNI): gVisor's netstack takes
		// over the namespace's interfaces; the node holds its egress
		// if the policy says so.
		if err := p.holdEgress(ctx, netnsPath(spec)); err != nil {
			return nil, err
		}
	case policy.NetNone:
		setNetns(spec, "")
	default:
		// The same host side as the CLI's sandboxes, with the resolver
		// served by the shim, which lives as long as the pod.
		p.linked = true
		n, err := assembly.SetupNetwork(ctx, assembly.NetworkSpec{
			ID: id, Dir: p.stateDir, Mode: pp.Network, Allow: pp.Allow, DNS: pp.DNS,
		}, assembly.ResolverInProcess{OnError: func(err error) {
			log.G(ctx).WithError(err).WithField("id", id).Error("DNS resolver stopped")
		}})
		if err != nil {
			return nil, err
		}
		p.resolver, p.netMounts = n.Resolver, n.Mounts
		setNetns(spec, n.NetnsPath)
	}
	return p, nil
}

// adjustSpec makes a container's spec fit the pod and the host: the
// sandbox's spec options from assembly (seccomp, limits, the pids
// backstop) for the pod's first container, the joining container's for
// the others; the container's own seccomp profile on top of hutch's, and
// its masked and read-only paths enforced inside gVisor (either refused
// when gVisor cannot enforce it as asked); a linked pod's containers
// resolve names through the pod's resolver, and an OOM score the shim
// may not set is raised to its own.
func (p *pod) adjustSpec(spec *specs.Spec, root bool) error {
	var own *specs.LinuxSeccomp
	if spec.Linux != nil {
		own = spec.Linux.Seccomp
	}
	empty, err := p.emptyFile()
	if err != nil {
		return err
	}
	opts := assembly.ContainerOpts(p.policy.request())
	if root {
		opts = assembly.SandboxOpts(p.policy.request())
	}
	opts = append(opts, assembly.PodSeccomp(own), assembly.MaskedPaths(empty), assembly.NoSetIDMounts())
	if p.agent != "" {
		opts = append(opts, assembly.AgentMount(p.agent))
	}
	if err := assembly.Apply(spec, opts...); err != nil {
		return err
	}
	clampOOMScoreAdj(spec)
	if err := p.ownPodCgroup(spec); err != nil {
		return err
	}
	if len(p.netMounts) > 0 {
		spec.Mounts = replaceMounts(spec.Mounts, p.netMounts)
	}
	return nil
}

// replaceMounts is mounts with add in place of any mount on the same
// destination.
func replaceMounts(mounts, add []specs.Mount) []specs.Mount {
	var out []specs.Mount
	for _, m := range mounts {
		if !slices.ContainsFunc(add, func(a specs.Mount) bool { return a.Destination == m.Destination }) {
			out = append(out, m)
		}
	}
	return append(out, add...)
}

// teardown removes the pod's host set-up. It is idempotent.
func (p *pod) teardown(ctx context.Context) error {
	var errs []error
	if p.egress != nil {
		if err := assembly.ReleasePodEgress(ctx, *p.egress); err != nil {
			errs = append(errs, err)
		}
	}
	if p.linked {
		if err := assembly.TeardownNetwork(ctx, p.id, p.resolver, false); err != nil {
			errs = append(errs, err)
		}
	}
	if p.stateDir != "" {
		if err := os.RemoveAll(p.stateDir); err != nil {
			errs = append(errs, err)
		}
	}
	if p.ownCgroup != "" {
		if err := assembly.RemoveCgroup(p.ownCgroup); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkHostNetwork refuses a sandbox on the host's network (a spec with
// no network namespace: Kubernetes' hostNetwork, CRI's NamespaceMode
// NODE): gVisor would take over the host's interfaces, outside hutch's
// network policy and the pod's. A pod that names hutch's network with
// AnnotationNetwork gets that instead, as it asked.
func checkHostNetwork(s *specs.Spec) error {
	if _, ok := s.Annotations[AnnotationNetwork]; ok || hasNetworkNamespace(s) {
		return nil
	}
	return fmt.Errorf("hutch policy: the pod asks for the host's network (hostNetwork, no network namespace), which hutch never gives a sandbox: it would reach the host's network outside hutch's policy; set annotation %s (none, allow or open, within the operator's ceiling) for hutch's own network instead: %w",
		AnnotationNetwork, errdefs.ErrPermissionDenied)
}

// hasNetworkNamespace reports whether the spec names a network namespace,
// new or joined.
func hasNetworkNamespace(s *specs.Spec) bool {
	if s.Linux == nil {
		return false
	}
	for _, n := range s.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			return true
		}
	}
	return false
}

// netnsPath is the network namespace path the spec names, if any.
func netnsPath(s *specs.Spec) string {
	if s.Linux == nil {
		return ""
	}
	for _, n := range s.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			return n.Path
		}
	}
	return ""
}

// setNetns makes the spec run in the namespace at path ("" for a new,
// empty one). A spec without a network namespace would mean the host's.
func setNetns(s *specs.Spec, path string) {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	for i, n := range s.Linux.Namespaces {
		if n.Type == specs.NetworkNamespace {
			s.Linux.Namespaces[i].Path = path
			return
		}
	}
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: path})
}

// clampOOMScoreAdj raises a spec's oom_score_adj to the shim's own when the
// shim lacks CAP_SYS_RESOURCE: runsc applies the score to the sandbox's
// gofer and would fail on the pause container's -998 otherwise. Hosts that
// grant containerd CAP_SYS_RESOURCE keep the score as asked.
func clampOOMScoreAdj(s *specs.Spec) {
	if s.Process == nil || s.Process.OOMScoreAdj == nil || hasCapSysResource() {
		return
	}
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return
	}
	own, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	if *s.Process.OOMScoreAdj < own {
		s.Process.OOMScoreAdj = &own
	}
}

// hasCapSysResource reports whether the shim may lower OOM scores.
func hasCapSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	return false
}

// ownPodCgroup puts a pod's sandbox in a cgroup of hutch's own, made
// below the pod's (the last path element starting with "pod", as kubelet
// names it) with the limits the pod's policy rendered into the spec, in
// place of the pause container's: kubelet's pod cgroup above it still
// bounds the pod as Kubernetes asked, and runsc, which applies limits
// only to cgroups it makes itself, joins a cgroup hutch made and owns, as a
// CLI sandbox does (docs/decisions/0004). Other sandboxes keep the cgroup
// their spec names.
func (p *pod) ownPodCgroup(s *specs.Spec) error {
	parent := podCgroupParent(s)
	if parent == "" {
		return nil
	}
	own := parent + "/hutch"
	// The host limits only: the spec's device rules are for the
	// sandbox's inside, and on the host cgroup they would deny runsc's
	// own processes /dev/null.
	res := &specs.LinuxResources{}
	if r := s.Linux.Resources; r != nil {
		res.CPU, res.Memory, res.Pids = r.CPU, r.Memory, r.Pids
	}
	// Under a pod whose CPU limit is below the policy's, the pod's binds:
	// a larger quota below it is refused by the kernel.
	if q, period, err := assembly.CPUQuota(parent); err == nil {
		assembly.ClampCPU(res, q, period)
	}
	if _, err := assembly.CreateCgroup(own, res); err != nil {
		return err
	}
	// The sandbox's own cgroup, as engine's sandboxes have: runsc joins
	// a cgroup it did not make and leaves its limits alone.
	p.ownCgroup = own
	s.Linux.CgroupsPath = own
	return nil
}

// podCgroupParent is the pod's cgroup above a pod sandbox's cgroupfs
// path, or "" (not a pod's sandbox, or systemd's paths).
func podCgroupParent(s *specs.Spec) string {
	if s.Annotations[criContainerType] != criTypeSandbox || s.Linux == nil || s.Linux.CgroupsPath == "" ||
		strings.Contains(s.Linux.CgroupsPath, ":") {
		return ""
	}
	parts := strings.Split(s.Linux.CgroupsPath, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if strings.HasPrefix(parts[i], "pod") {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return ""
}
