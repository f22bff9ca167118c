package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/buildimg"
	"hutch.dev/hutch/policy"
)

// A build allow list's steps run on a buildkitd of its own, under
// <root>/buildnet/<hash of the list>: the daemon's supervisor holds
// the list and makes each step's network with it (buildimg.Daemon.Allow),
// and no step of another list, or of a build without network, shares
// that daemon or its cache. The step's network is a sandbox's in mode
// allow, enforced by the same firewall, resolver and egress gateway.

// netDaemonsDir holds the daemons of build allow lists.
func (e *Engine) netDaemonsDir() string { return filepath.Join(e.opts.Root, "buildnet") }

func (e *Engine) netDaemonDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(e.netDaemonsDir(), "*"))
	return dirs
}

// ParseBuildAllow checks a build allow list and its DNS servers: each
// rule as --allow takes it, each server an IP address. Bad input wraps
// errdefs.ErrInvalidArgument.
func ParseBuildAllow(allow, dns []string) error {
	if _, err := policy.ParseAllowList(allow); err != nil {
		return fmt.Errorf("build allow list: %w", err)
	}
	for _, d := range dns {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("build DNS server %q: want an IP address: %w", d, errdefs.ErrInvalidArgument)
		}
	}
	if len(dns) > 0 && len(allow) == 0 {
		return fmt.Errorf("build DNS servers without an allow list: the steps have no network to ask them from: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// netBuilder is the builder of build allow list allow: its own daemon,
// whose steps reach what allow names and trust the host's CA
// certificates (hostCABundle).
func (e *Engine) netBuilder(allow, dns []string) (*buildimg.Builder, error) {
	if err := ParseBuildAllow(allow, dns); err != nil {
		return nil, err
	}
	if e.opts.BuildkitAddr != "" {
		return nil, fmt.Errorf("a build allow list needs hutch's own buildkitd, not the one at %s: %w", e.opts.BuildkitAddr, errdefs.ErrInvalidArgument)
	}
	if e.rootless {
		return nil, fmt.Errorf("a build allow list needs root: a rootless build's steps have no network: %w", errdefs.ErrInvalidArgument)
	}
	rules := slices.Clone(allow)
	slices.Sort(rules)
	rules = slices.Compact(rules)
	servers := slices.Clone(dns)
	slices.Sort(servers)
	sum := sha256.Sum256([]byte(strings.Join(rules, "\n") + "\x00" + strings.Join(servers, "\n")))
	b := e.builder()
	b.Daemon.Dir = filepath.Join(e.netDaemonsDir(), hex.EncodeToString(sum[:8]))
	b.Daemon.Allow, b.Daemon.DNS = rules, servers
	if err := os.MkdirAll(b.Daemon.Dir, 0o700); err != nil {
		return nil, err
	}
	bundle := filepath.Join(b.Daemon.Dir, caBundleFile)
	if err := e.writeHostCABundle(bundle); err != nil {
		return nil, err
	}
	b.Daemon.CABundle = bundle
	return b, nil
}

// writeHostCABundle writes the host's trust to file: its system bundle
// (the first of systemCABundles it has) and the state root's trust
// directory. It replaces the file whole, so that a step that has it
// mounted keeps the one it started with.
func (e *Engine) writeHostCABundle(file string) error {
	var out []byte
	for _, p := range systemCABundles {
		b, err := os.ReadFile(p)
		if err == nil {
			out = append(out, b...)
			break
		}
	}
	extra, err := e.trustFiles()
	if err != nil {
		return err
	}
	for _, c := range extra {
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		out = append(out, c.PEM...)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".ca-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}
