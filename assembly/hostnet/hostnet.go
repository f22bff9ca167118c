// Package hostnet applies a sandbox's network policy on the host: a network
// namespace and veth pair per sandbox, an address pair from a host-wide
// pool, the nftables table that policy.RenderFirewall renders, and the DNS
// resolver that admits the addresses of allowed domains.
//
// It is part of the assembly: unlike package policy, it changes the host.
// It never runs a sandbox:
// runsc is handed the namespace this package prepares.
package hostnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"hutch.dev/hutch/policy"
)

// Pool is the address space sandboxes take their /30 links from: the host
// end is .1, the sandbox .2 of each.
var Pool = netip.MustParsePrefix("10.200.0.0/16")

// LeaseDir holds one file per allocated /30, named by its index (see
// lease.go). It is on a tmpfs: after a reboot every netns is gone and so
// are the leases.
var LeaseDir = "/run/hutch/net"

const sandboxIf = "eth0"

// Network is one sandbox's host network set-up. Every name in it derives
// from the sandbox ID, so it can be torn down from the ID alone.
type Network struct {
	ID        string
	Index     int
	NetnsName string
	HostIf    string
	Table     string
	HostIP    netip.Addr
	SandboxIP netip.Addr
}

// NetnsPath is where the sandbox's network namespace is bind-mounted.
func (n *Network) NetnsPath() string { return filepath.Join("/var/run/netns", n.NetnsName) }

// setAddrs derives the link's addresses from the lease index.
func (n *Network) setAddrs() {
	base := Pool.Addr().As4()
	off := n.Index * 4
	base[2] += byte(off >> 8)
	base[3] += byte(off)
	n.HostIP = netip.AddrFrom4(base).Next()
	n.SandboxIP = n.HostIP.Next()
}

// Lookup returns the set-up Setup made for id.
func Lookup(id string) (*Network, error) {
	n := names(id)
	idx, ok := leaseOf(id)
	if !ok {
		return nil, fmt.Errorf("sandbox %s has no network set-up: %w", id, errdefs.ErrNotFound)
	}
	n.Index = idx
	n.setAddrs()
	return n, nil
}

// idHash is the hex SHA-256 of id, which names derived from an ID that
// must be short or plain take their characters from.
func idHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// names fills the ID-derived names. Interface and table names are short
// (an interface name has 15 bytes at most), so they come from a hash of
// the whole ID, never from its first characters: the shim's IDs are
// chosen by its callers, and two that share a prefix must not share a
// link or a table (nor tear down each other's).
func names(id string) *Network {
	short := idHash(id)[:12]
	return &Network{
		ID:        id,
		NetnsName: "hutch-" + id,
		HostIf:    "hutch" + short[:min(len(short), 10)],
		Table:     "hutch_" + short,
	}
}

// Setup allocates an address pair and creates the sandbox's namespace and
// link, with the firewall in place and what the sandbox sends limited to
// rate bits per second (0: no limit) before the link is up. On error it
// leaves nothing behind.
func Setup(ctx context.Context, id string, fw policy.FirewallConfig, rate int64) (n *Network, err error) {
	n = names(id)
	defer func() {
		if err != nil {
			Teardown(ctx, id) //nolint:errcheck // best effort; the first error matters
		}
	}()
	if n.Index, err = allocate(id); err != nil {
		return nil, err
	}
	n.setAddrs()

	fw.Table, fw.HostIf, fw.HostIP, fw.SandboxIP = n.Table, n.HostIf, n.HostIP, n.SandboxIP
	if err := ApplyFirewall(ctx, fw); err != nil {
		return nil, err
	}
	if err := enableForwarding(ctx); err != nil {
		return nil, err
	}
	ns, err := newNamedNetns(n.NetnsName)
	if err != nil {
		return nil, fmt.Errorf("create network namespace: %w", err)
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.HostIf},
		PeerName:      sandboxIf,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("create veth %s: %w", n.HostIf, err)
	}
	host, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return nil, err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(n.HostIP, 30)}); err != nil {
		return nil, fmt.Errorf("address %s: %w", n.HostIP, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return nil, err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := configureSandboxSide(h, n, rate); err != nil {
		return nil, fmt.Errorf("configure %s in %s: %w", sandboxIf, n.NetnsName, err)
	}
	return n, nil
}

func configureSandboxSide(h *netlink.Handle, n *Network, rate int64) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	eth, err := h.LinkByName(sandboxIf)
	if err != nil {
		return err
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(n.SandboxIP, 30)}); err != nil {
		return err
	}
	if err := limitEgress(h, eth, rate); err != nil {
		return err
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(n.HostIP.AsSlice())})
}

// newNamedNetns creates a network namespace bind-mounted under
// /var/run/netns, without moving the calling goroutine into it.
func newNamedNetns(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, err
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// This thread is in the wrong namespace; do not let Go reuse it.
		runtime.LockOSThread()
		return 0, fmt.Errorf("return to the host network namespace: %w", serr)
	}
	return ns, err
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// Teardown removes everything Setup made for id. It is idempotent and
// safe on a half-made set-up.
func Teardown(ctx context.Context, id string) error {
	return errors.Join(Suspend(ctx, id), release(id))
}

// Suspend removes what Setup made for id but keeps its address lease, so
// that a later Setup (a resume) gives the sandbox the address its
// checkpointed network stack has. Teardown releases it.
func Suspend(ctx context.Context, id string) error {
	n := names(id)
	var errs []error
	if err := nft(ctx, fmt.Sprintf("add table inet %s\ndelete table inet %s\n", n.Table, n.Table)); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlink.LinkByName(n.HostIf); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", n.HostIf, err))
		}
	}
	if _, err := os.Stat(n.NetnsPath()); err == nil {
		if err := netns.DeleteNamed(n.NetnsName); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", n.NetnsName, err))
		}
	}
	return errors.Join(errs...)
}

// ForwardGuard is the nftables table that keeps the host from routing
// anything but sandboxes' traffic once hutch has turned IPv4 forwarding on.
const ForwardGuard = "hutch_forward"

// enableForwarding turns on IPv4 forwarding, which sandboxes' links need.
// The switch is host-wide: it would make the host a router between all its
// interfaces. If forwarding was off (the host did not mean to route),
// the guard table goes in first, accepting forwarded packets only from or
// to hutch's links; a host that routes already (a Kubernetes node, a
// container host) keeps routing as it did.
func enableForwarding(ctx context.Context) error {
	const sysctl = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(sysctl)
	if err != nil {
		return fmt.Errorf("read IPv4 forwarding: %w", err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := nft(ctx, renderForwardGuard()); err != nil {
		return fmt.Errorf("forwarding guard: %w", err)
	}
	if err := os.WriteFile(sysctl, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	return nil
}

// renderForwardGuard is the guard table: it drops what the host would
// forward between interfaces that are not hutch's links (each sandbox's own
// table then decides what its link may carry).
func renderForwardGuard() string {
	return fmt.Sprintf(`add table inet %[1]s
delete table inet %[1]s
table inet %[1]s {
	chain forward {
		type filter hook forward priority filter - 1; policy drop;
		iifname "hutch*" accept
		oifname "hutch*" accept
	}
}
`, ForwardGuard)
}

// ApplyFirewall replaces the sandbox's nftables table with the one the
// policy renders, atomically.
func ApplyFirewall(ctx context.Context, fw policy.FirewallConfig) error {
	return nft(ctx, policy.RenderFirewall(fw))
}

// nft runs an nft script as one transaction.
func nft(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("nft not found (install nftables): %w", errdefs.ErrNotFound)
		}
		return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Leftovers lists what of id's set-up exists on the host; empty means
// none. For tests and doctor.
func Leftovers(ctx context.Context, id string) []string {
	n := names(id)
	var left []string
	if _, err := netlink.LinkByName(n.HostIf); err == nil {
		left = append(left, "link "+n.HostIf)
	}
	if _, err := os.Stat(n.NetnsPath()); err == nil {
		left = append(left, "netns "+n.NetnsName)
	}
	if err := exec.CommandContext(ctx, "nft", "list", "table", "inet", n.Table).Run(); err == nil {
		left = append(left, "nftables table "+n.Table)
	}
	if i, ok := leaseOf(id); ok {
		left = append(left, "address lease "+strconv.Itoa(i))
	}
	return left
}
