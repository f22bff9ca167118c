package engine

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"sbx.dev/sbx/policy"
	"sbx.dev/sbx/policy/hostnet"
)

// ResolverCommand is the sbx subcommand that runs a sandbox's DNS
// resolver; its one argument is the resolver's configuration file.
const ResolverCommand = "__dns-resolver"

// runscNetwork is runsc's --network for a sandbox's mode: gVisor's own
// netstack on a prepared namespace, or loopback only.
func runscNetwork(linked bool) string {
	if linked {
		return "sandbox"
	}
	return "none"
}

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
	return hostnet.Teardown(ctx, sb.ID)
}

// UpdateRequest changes the policy of a running sandbox. Nil fields keep
// their current value.
type UpdateRequest struct {
	// Network is the new mode. A sandbox created with network none has
	// no link to give a network to; it can only stay none. Changing to
	// none drops the allow rules.
	Network *string
	// Allow replaces the allow rules.
	Allow *[]string
}

// Update replaces a running sandbox's network policy. The firewall changes
// in one transaction (addresses admitted for names under the old policy
// are dropped with it) and the resolver answers under the new policy from
// its next query.
func (e *Engine) Update(ctx context.Context, ref string, req UpdateRequest) (*Sandbox, error) {
	sb, unlock, err := e.getLocked(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s, not running: %w", sb.ShortID(), sb.State, errdefs.ErrFailedPrecondition)
	}
	mode, rules := sb.Network, sb.Allow
	if req.Network != nil {
		mode = *req.Network
	}
	if req.Allow != nil {
		rules = *req.Allow
	} else if mode == policy.NetNone {
		// Rules mean nothing without a network; they go with it.
		rules = nil
	}
	allow, err := policy.ParseAllowList(rules)
	if err != nil {
		return nil, err
	}
	pr, err := policy.Validate(policy.Request{
		CPUs: sb.CPUs, Memory: sb.Memory, Pids: sb.Pids, Disk: sb.Disk,
		Network: mode, Allow: allow, DNS: sb.DNS, Rootless: sb.Rootless,
	})
	if err != nil {
		return nil, err
	}
	if !sb.Linked && pr.Network != policy.NetNone {
		return nil, fmt.Errorf("sandbox %s was created with --net none and has no network link: create it with --net open or allow: %w", sb.ShortID(), errdefs.ErrFailedPrecondition)
	}
	if sb.Linked {
		cfgPath := e.resolverConfigPath(sb.ID)
		cfg, err := hostnet.ReadResolverConfig(cfgPath)
		if err != nil {
			return nil, err
		}
		cfg.Mode, cfg.Allow = pr.Network, allow
		n, err := hostnet.Lookup(sb.ID)
		if err != nil {
			return nil, err
		}
		if err := hostnet.ApplyFirewall(ctx, policy.FirewallConfig{
			Table: n.Table, HostIf: n.HostIf, HostIP: n.HostIP, SandboxIP: n.SandboxIP,
			Mode: pr.Network, Allow: allow,
		}); err != nil {
			return nil, err
		}
		if err := hostnet.WriteResolverConfig(cfgPath, *cfg); err != nil {
			return nil, err
		}
	}
	sb.Network, sb.Allow = pr.Network, rules
	if err := e.save(sb); err != nil {
		return nil, err
	}
	return sb, nil
}
