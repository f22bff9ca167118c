package assembly

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly/hostnet"
	"hutch.dev/hutch/policy"
)

// NetworkSpec is a linked sandbox's network as policy decided it: what
// SetupNetwork builds on the host for engine and shim alike.
type NetworkSpec struct {
	// ID names the namespace, the host link, the nftables table and the
	// address lease; the teardown needs nothing else.
	ID string
	// Dir is the sandbox's own state directory: resolv.conf, the
	// resolver's configuration and log go there.
	Dir string
	// Mode is open, allow or none (none: a linked sandbox updated to
	// none keeps its link, firewalled shut).
	Mode  string
	Allow []policy.AllowRule
	// DNS are the upstream servers the resolver forwards to; none means
	// the host's own.
	DNS []string
	// Rate limits what the sandbox sends, in bits per second; 0 is no
	// limit.
	Rate int64
	// Resume: the sandbox was paused and resumes on the address it had;
	// a failed set-up keeps its address lease.
	Resume bool
	// Gateway: the sandbox's web connections go through the egress
	// gateway (package egress) in mode allow, served beside its
	// resolver, logging to EgressLogPath(Dir).
	Gateway bool
	// Inject are the gateway's inject rules; GatewayCA the file of the
	// CA it presents their hosts' certificates with (egress.NewCA), and
	// Secrets the host's secret store their values come from.
	Inject    []policy.InjectRule
	GatewayCA string
	Secrets   string
}

// EgressLogPath is the egress log of the sandbox whose state directory is
// dir (egress.ReadLog reads it).
func EgressLogPath(dir string) string { return filepath.Join(dir, "egress.log") }

// Resolver says where a sandbox's DNS resolver runs. The resolver admits
// the addresses of allowed names into the sandbox's firewall; it must live
// as long as the sandbox does.
type Resolver interface {
	start(cfg, log string) (*ResolverHandle, error)
}

// ResolverProcess runs the resolver as a process of its own, detached, for
// front ends that do not outlive their sandboxes (the CLI has no daemon):
// Exe with Args and the configuration file's path as its last argument is
// a program that calls ServeResolverProcess.
type ResolverProcess struct {
	Exe  string
	Args []string
}

// ServeResolverProcess is the body of a ResolverProcess program: it
// serves the resolver configured by the file cfg until ctx ends, telling
// the process that started it once it listens.
func ServeResolverProcess(ctx context.Context, cfg string) error {
	return hostnet.ServeResolver(ctx, cfg, hostnet.ReadyPipe())
}

func (r ResolverProcess) start(cfg, log string) (*ResolverHandle, error) {
	pid, err := hostnet.StartResolver(r.Exe, append(append([]string{}, r.Args...), cfg), log)
	if err != nil {
		return nil, err
	}
	start, err := ProcessStart(pid)
	if err != nil {
		syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // it exited already
		return nil, fmt.Errorf("DNS resolver exited right after its start: %w", err)
	}
	return &ResolverHandle{Pid: pid, Start: start}, nil
}

// ResolverInProcess serves the resolver in the calling process until its
// handle is stopped, for a front end that lives as long as its sandbox
// (the shim, one per pod).
type ResolverInProcess struct {
	// OnError is told why the resolver stopped, if it did on its own.
	OnError func(error)
}

func (r ResolverInProcess) start(cfg, _ string) (*ResolverHandle, error) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan error, 1)
	go func() {
		err := hostnet.ServeResolver(ctx, cfg, func(err error) { ready <- err })
		if err != nil && r.OnError != nil && ctx.Err() == nil {
			r.OnError(err)
		}
	}()
	if err := <-ready; err != nil {
		cancel()
		return nil, err
	}
	return &ResolverHandle{cancel: cancel}, nil
}

// ResolverHandle identifies a running resolver: a process (Pid and its
// start time, which a later process can stop it by) or a goroutine of
// this process.
type ResolverHandle struct {
	Pid    int
	Start  uint64
	cancel context.CancelFunc
}

// Stop ends the resolver; it is idempotent, and a process that is no
// longer the one started (its PID reused) is left alone.
func (h *ResolverHandle) Stop() {
	if h == nil {
		return
	}
	if h.cancel != nil {
		h.cancel()
	}
	if h.Pid != 0 && SameProcess(h.Pid, h.Start) {
		syscall.Kill(h.Pid, syscall.SIGKILL) //nolint:errcheck // may be gone
	}
	h.Pid, h.Start, h.cancel = 0, 0, nil
}

// Network is the host side of a linked sandbox that SetupNetwork made.
type Network struct {
	// NetnsPath is the namespace runsc is to run the sandbox in.
	NetnsPath string
	SandboxIP string
	// Mounts give the sandbox its resolv.conf, naming the resolver.
	Mounts   []specs.Mount
	Resolver *ResolverHandle
}

// SetupNetwork makes a sandbox's host side: the namespace and its link,
// the firewall (in place before the link is up), resolv.conf and the DNS
// resolver. On error nothing is left but the address lease of a resumed
// sandbox.
func SetupNetwork(ctx context.Context, s NetworkSpec, r Resolver) (_ *Network, err error) {
	var handle *ResolverHandle
	defer func() {
		if err != nil {
			TeardownNetwork(context.WithoutCancel(ctx), s.ID, handle, s.Resume) //nolint:errcheck // the first error matters
		}
	}()
	n, err := hostnet.Setup(ctx, s.ID, policy.FirewallConfig{Mode: s.Mode, Allow: s.Allow, Gateway: s.Gateway}, s.Rate)
	if err != nil {
		return nil, err
	}
	resolvConf := filepath.Join(s.Dir, "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+n.HostIP.String()+"\n"), 0o644); err != nil {
		return nil, err
	}
	upstreams := hostnet.HostUpstreams()
	if len(s.DNS) > 0 {
		upstreams = nil
		for _, d := range s.DNS {
			upstreams = append(upstreams, net.JoinHostPort(d, "53"))
		}
	}
	cfg := ResolverConfigPath(s.Dir)
	rc := hostnet.ResolverConfig{
		Listen: net.JoinHostPort(n.HostIP.String(), "53"), Upstreams: upstreams,
		Mode: s.Mode, Allow: s.Allow, Table: n.Table,
	}
	if s.Gateway {
		rc.Gateway = &hostnet.GatewayConfig{
			HTTP:   net.JoinHostPort(n.HostIP.String(), strconv.Itoa(policy.GatewayHTTPPort)),
			TLS:    net.JoinHostPort(n.HostIP.String(), strconv.Itoa(policy.GatewayTLSPort)),
			Log:    EgressLogPath(s.Dir),
			Inject: s.Inject, CA: s.GatewayCA, Secrets: s.Secrets,
		}
	}
	if err := hostnet.WriteResolverConfig(cfg, rc); err != nil {
		return nil, err
	}
	if handle, err = r.start(cfg, filepath.Join(s.Dir, "resolver.log")); err != nil {
		return nil, err
	}
	return &Network{
		NetnsPath: n.NetnsPath(),
		SandboxIP: n.SandboxIP.String(),
		Mounts: []specs.Mount{{
			Destination: "/etc/resolv.conf", Type: "bind", Source: resolvConf,
			Options: []string{"rbind", "ro"},
		}},
		Resolver: handle,
	}, nil
}

// ResolverConfigPath is where the resolver's configuration of the sandbox
// whose state directory is dir lives.
func ResolverConfigPath(dir string) string { return filepath.Join(dir, "resolver.json") }

// UpdateNetwork replaces a linked sandbox's policy: its firewall and what
// its resolver admits, in an order that never lets a name the new policy
// revokes be admitted again by a query in flight (hostnet.UpdatePolicy).
func UpdateNetwork(ctx context.Context, s NetworkSpec) error {
	cfgPath := ResolverConfigPath(s.Dir)
	cfg, err := hostnet.ReadResolverConfig(cfgPath)
	if err != nil {
		return err
	}
	n, err := hostnet.Lookup(s.ID)
	if err != nil {
		return err
	}
	cfg.Mode, cfg.Allow = s.Mode, s.Allow
	return hostnet.UpdatePolicy(cfgPath, *cfg, func() error {
		return hostnet.ApplyFirewall(ctx, policy.FirewallConfig{
			Table: n.Table, HostIf: n.HostIf, HostIP: n.HostIP, SandboxIP: n.SandboxIP,
			Mode: s.Mode, Allow: s.Allow, Gateway: cfg.Gateway != nil,
		})
	})
}

// TeardownNetwork stops the resolver and removes what SetupNetwork made
// for id. With keepLease the address lease stays, so that the sandbox
// (paused) resumes on its address; otherwise it is released. It is
// idempotent and safe on a half-made set-up.
func TeardownNetwork(ctx context.Context, id string, resolver *ResolverHandle, keepLease bool) error {
	resolver.Stop()
	if keepLease {
		return hostnet.Suspend(ctx, id)
	}
	return hostnet.Teardown(ctx, id)
}

// PodEgress is a pod's entry in the node's egress table (hostnet.PodEgress).
type PodEgress = hostnet.PodEgress

// HoldPodEgress holds a pod on its own network (CNI) to public egress,
// enforced on the node (hostnet.PodEgressTable).
func HoldPodEgress(ctx context.Context, p PodEgress) error { return hostnet.AddPodEgress(ctx, p) }

// ReleasePodEgress undoes HoldPodEgress; it may run again.
func ReleasePodEgress(ctx context.Context, p PodEgress) error {
	return hostnet.RemovePodEgress(ctx, p)
}

// NetnsAddrs lists the global unicast addresses of the network namespace
// at path (hostnet.NetnsAddrs).
func NetnsAddrs(path string) ([]netip.Addr, error) { return hostnet.NetnsAddrs(path) }
