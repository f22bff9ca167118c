package engine

import (
	"cmp"
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
)

// ResolverCommand is the hutch subcommand that runs a sandbox's DNS
// resolver; its one argument is the resolver's configuration file.
const ResolverCommand = "__dns-resolver"

// setupNetwork prepares the host side of a sandbox with a network through
// the assembly: the namespace and link, the firewall, and the DNS resolver
// the sandbox's /etc/resolv.conf names. It returns the namespace path and
// the mounts the spec needs; for network none, nothing.
func (e *Engine) setupNetwork(ctx context.Context, sb *record, allow []policy.AllowRule, undo *assembly.Undo) (string, []specs.Mount, error) {
	if sb.Network == policy.NetNone {
		return "", nil, nil
	}
	return e.linkNetwork(ctx, sb, allow, undo)
}

// linkNetwork makes sb's namespace, link, firewall (its mode, none
// included: an updated sandbox keeps its link) and resolver. The resolver
// is a detached hutch process: the engine has no daemon to serve it.
func (e *Engine) linkNetwork(ctx context.Context, sb *record, allow []policy.AllowRule, undo *assembly.Undo) (string, []specs.Mount, error) {
	undo.Add(func() { e.teardownNetwork(context.Background(), sb) }) //nolint:errcheck // best effort undo
	spec := assembly.NetworkSpec{
		ID: sb.ID, Dir: e.sandboxDir(sb.ID), Mode: sb.Network, Allow: allow, DNS: sb.DNS, Rate: sb.NetRate, Resume: sb.Paused,
		// Root's sandboxes only, for now: a rootless sandbox's traffic
		// leaves through slirp4netns.
		Gateway: !sb.Rootless,
		Inject:  sb.Inject, GatewayCA: gatewayCAPath(e.sandboxDir(sb.ID)), Secrets: e.secretStore(),
	}
	var n *assembly.Network
	var err error
	if sb.Rootless {
		// Namespaces the user owns, with user-mode networking
		// (docs/decisions/0022-rootless-network.md).
		n, err = assembly.SetupRootlessNetwork(ctx, spec, cmp.Or(e.helperPath(), e.opts.HutchPath), []string{ResolverCommand})
	} else {
		n, err = assembly.SetupNetwork(ctx, spec, assembly.ResolverProcess{Exe: e.opts.HutchPath, Args: []string{ResolverCommand}})
	}
	if err != nil {
		return "", nil, err
	}
	sb.IP, sb.Linked = n.SandboxIP, true
	sb.ResolverPid, sb.ResolverStart = n.Resolver.Pid, n.Resolver.Start
	// Save now, so that a crash from here on still knows the resolver.
	if err := e.save(sb); err != nil {
		return "", nil, err
	}
	return n.NetnsPath, n.Mounts, nil
}

// checkNetRate refuses an egress rate that this sandbox could not be
// given: without network it sends nothing; a rootless sandbox's traffic
// leaves through slirp4netns, which hutch does not shape.
func (e *Engine) checkNetRate(rate int64, network string) error {
	switch {
	case rate == 0:
		return nil
	case rate < policy.MinNetRate || rate > policy.MaxNetRate:
		return fmt.Errorf("--net-rate %d bit/s: want between 64kbit and 32gbit: %w", rate, errdefs.ErrInvalidArgument)
	case network == policy.NetNone:
		return fmt.Errorf("--net-rate: the sandbox has no network (--net none) to limit: %w", errdefs.ErrInvalidArgument)
	case e.rootless:
		return fmt.Errorf("--net-rate: a rootless sandbox's traffic goes through slirp4netns, which hutch cannot limit; run as root for a rate: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// updateNetwork replaces a linked sandbox's firewall and what its resolver
// admits.
func (e *Engine) updateNetwork(ctx context.Context, sb *record, mode string, allow []policy.AllowRule) error {
	spec := assembly.NetworkSpec{
		ID: sb.ID, Dir: e.sandboxDir(sb.ID), Mode: mode, Allow: allow, DNS: sb.DNS,
	}
	if sb.Rootless {
		return assembly.UpdateRootlessNetwork(ctx, spec)
	}
	return assembly.UpdateNetwork(ctx, spec)
}

// teardownNetwork stops the resolver and removes the host set-up; a paused
// sandbox keeps its address for its resume. It is idempotent.
func (e *Engine) teardownNetwork(ctx context.Context, sb *record) error {
	if !sb.Linked {
		return nil
	}
	if sb.Rootless {
		// Nothing outlives a pause: the resume makes it all again, on
		// the same addresses.
		return e.releaseNetwork(ctx, sb)
	}
	err := assembly.TeardownNetwork(ctx, sb.ID, &assembly.ResolverHandle{Pid: sb.ResolverPid, Start: sb.ResolverStart}, sb.Paused)
	sb.ResolverPid, sb.ResolverStart = 0, 0
	return err
}

// releaseNetwork removes all of a sandbox's host network, the address
// lease a paused sandbox kept for its resume included. It is idempotent.
func (e *Engine) releaseNetwork(ctx context.Context, sb *record) error {
	if !sb.Linked {
		return nil
	}
	var err error
	if sb.Rootless {
		err = assembly.TeardownRootlessNetwork(e.sandboxDir(sb.ID), &assembly.ResolverHandle{Pid: sb.ResolverPid, Start: sb.ResolverStart})
	} else {
		err = assembly.TeardownNetwork(ctx, sb.ID, &assembly.ResolverHandle{Pid: sb.ResolverPid, Start: sb.ResolverStart}, false)
	}
	sb.ResolverPid, sb.ResolverStart = 0, 0
	return err
}

// resumeNetwork rebuilds the host side of a paused sandbox's network on
// the address it had, before its checkpoint is restored.
func (e *Engine) resumeNetwork(ctx context.Context, sb *record, undo *assembly.Undo) error {
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

// RootlessNetworkMissing says what a rootless sandbox's --net open or
// allow needs and this user lacks on this host, each with its fix; empty
// means nothing (and always for root).
func (e *Engine) RootlessNetworkMissing() []assembly.RootlessNeed {
	if !e.rootless {
		return nil
	}
	return assembly.RootlessNetworkMissing()
}

// checkRootlessNetwork refuses, before anything is made, a rootless
// sandbox with a network the host cannot give this user.
func (e *Engine) checkRootlessNetwork(mode string) error {
	if !e.rootless || mode == policy.NetNone {
		return nil
	}
	return assembly.CheckRootlessNetwork(mode)
}

// inUserNS reports whether runsc runs for sandbox id as root of a user
// namespace of the user's (rootless, with a network or overlay
// workspaces: runscFor's Wrapper).
func (e *Engine) inUserNS(id string) bool {
	return e.rootless && assembly.RootlessRunsc(e.sandboxDir(id)) != nil
}

// hostID is the ID a rootless sandbox's user namespace maps root to: the
// user's own, or, when runsc runs as root of a user namespace of the
// user's (inUserNS), that namespace's root.
func hostID(inUserNS bool, id int) uint32 {
	if inUserNS {
		return 0
	}
	return uint32(id)
}

// forkNetwork gives fork sb of parent, whose spec is its parent's, a
// network of its own. Root's forks get none (their record says so), and
// so does a fork of a rootless sandbox without a network. A rootless
// parent with one ran as root of a user namespace of the user's, which
// its checkpoint's ID mapping records and a restore must match: its fork
// gets namespaces of its own in the same way, with its parent's network
// mode and policy, on the same addresses (every rootless sandbox's link
// is alike), which its restored network stack keeps.
func (e *Engine) forkNetwork(ctx context.Context, parent, sb *record, spec *specs.Spec, undo *assembly.Undo) error {
	if !sb.Rootless || !parent.Linked || spec.Linux == nil {
		return nil
	}
	sb.Network, sb.Allow, sb.DNS = parent.Network, parent.Allow, parent.DNS
	allow, err := policy.ParseAllowList(sb.Allow)
	if err != nil {
		return err
	}
	netns, mounts, err := e.linkNetwork(ctx, sb, allow, undo)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = netns
		}
	}
	for _, m := range mounts {
		for i := range spec.Mounts {
			if spec.Mounts[i].Destination == m.Destination {
				spec.Mounts[i].Source = m.Source
			}
		}
	}
	return nil
}
