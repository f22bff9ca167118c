package engine

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/assembly/hostnet"
	"sbx.dev/sbx/policy"
)

// ResolverCommand is the sbx subcommand that runs a sandbox's DNS
// resolver; its one argument is the resolver's configuration file.
const ResolverCommand = "__dns-resolver"

func (e *Engine) resolverConfigPath(id string) string {
	return filepath.Join(e.sandboxDir(id), "resolver.json")
}

// setupNetwork prepares the host side of a sandbox with a network: the
// namespace and link, the firewall, and the DNS resolver the sandbox's
// /etc/resolv.conf names. It returns the namespace path and the mounts the
// spec needs; for network none, nothing.
func (e *Engine) setupNetwork(ctx context.Context, sb *Sandbox, allow []policy.AllowRule, undo *cleanup) (string, []specs.Mount, error) {
	if sb.Network == policy.NetNone {
		return "", nil, nil
	}
	return e.linkNetwork(ctx, sb, allow, undo)
}

// linkNetwork makes sb's namespace, link, firewall (its mode, none
// included: an updated sandbox keeps its link) and resolver.
func (e *Engine) linkNetwork(ctx context.Context, sb *Sandbox, allow []policy.AllowRule, undo *cleanup) (string, []specs.Mount, error) {
	undo.add(func() { e.teardownNetwork(context.Background(), sb) }) //nolint:errcheck // best effort undo
	n, err := hostnet.Setup(ctx, sb.ID, policy.FirewallConfig{Mode: sb.Network, Allow: allow})
	if err != nil {
		return "", nil, err
	}
	sb.IP, sb.Linked = n.SandboxIP.String(), true
	resolvConf := filepath.Join(e.sandboxDir(sb.ID), "resolv.conf")
	if err := os.WriteFile(resolvConf, []byte("nameserver "+n.HostIP.String()+"\n"), 0o644); err != nil {
		return "", nil, err
	}
	upstreams := hostnet.HostUpstreams()
	if len(sb.DNS) > 0 {
		upstreams = nil
		for _, d := range sb.DNS {
			upstreams = append(upstreams, net.JoinHostPort(d, "53"))
		}
	}
	cfg := e.resolverConfigPath(sb.ID)
	if err := hostnet.WriteResolverConfig(cfg, hostnet.ResolverConfig{
		Listen: net.JoinHostPort(n.HostIP.String(), "53"), Upstreams: upstreams,
		Mode: sb.Network, Allow: allow, Table: n.Table,
	}); err != nil {
		return "", nil, err
	}
	pid, err := hostnet.StartResolver(e.opts.SbxPath, []string{ResolverCommand, cfg}, filepath.Join(e.sandboxDir(sb.ID), "resolver.log"))
	if err != nil {
		return "", nil, err
	}
	sb.ResolverPid = pid
	if sb.ResolverStart, err = procStartTime(pid); err != nil {
		return "", nil, err
	}
	// Save now, so that a crash from here on still knows the resolver.
	if err := e.save(sb); err != nil {
		return "", nil, err
	}
	mounts := []specs.Mount{{
		Destination: "/etc/resolv.conf", Type: "bind", Source: resolvConf,
		Options: []string{"rbind", "ro"},
	}}
	return n.NetnsPath(), mounts, nil
}

// teardownNetwork stops the resolver and removes the host set-up. It is
// idempotent.
func (e *Engine) teardownNetwork(ctx context.Context, sb *Sandbox) error {
	if !sb.Linked {
		return nil
	}
	if sb.ResolverPid != 0 && sameProcess(sb.ResolverPid, sb.ResolverStart) {
		syscall.Kill(sb.ResolverPid, syscall.SIGKILL) //nolint:errcheck // may be gone
	}
	sb.ResolverPid, sb.ResolverStart = 0, 0
	if sb.Paused {
		// Its resume needs the same address.
		return hostnet.Suspend(ctx, sb.ID)
	}
	return hostnet.Teardown(ctx, sb.ID)
}

// resumeNetwork rebuilds the host side of a paused sandbox's network on
// the address it had, before its checkpoint is restored.
func (e *Engine) resumeNetwork(ctx context.Context, sb *Sandbox, undo *cleanup) error {
	if !sb.Linked {
		return nil
	}
	allow, err := policy.ParseAllowList(sb.Allow)
	if err != nil {
		return err
	}
	_, _, err = e.linkNetwork(ctx, sb, allow, undo)
	return err
}
