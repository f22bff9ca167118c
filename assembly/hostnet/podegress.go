package hostnet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/policy"
)

// PodEgressTable is the nftables table that holds pods on their own
// network (a Kubernetes pod network, CNI) to the egress a sandbox with
// network open has: no private or link-local address (other pods, the
// node's network, cloud metadata), no address of the node itself, no
// other such pod; replies to connections made to the pod, and DNS to the
// pod's own nameservers, still pass. It is one table for the node: each
// pod adds its addresses to its sets, and the chains match the sets.
// Filtering where the pod's packets enter the node's IP stack (forward
// and input) holds whatever the pod does inside its own namespace, and
// needs no NetworkPolicy engine.
const PodEgressTable = "hutch_pods"

// PodEgress is one pod's entry in PodEgressTable: its addresses, and the
// nameservers it may query on port 53.
type PodEgress struct {
	Addrs       []netip.Addr `json:"addrs"`
	Nameservers []netip.Addr `json:"nameservers,omitempty"`
}

// podEgressLock serializes the table's creation between the shims of a
// node.
const podEgressLock = "/run/hutch/pod-egress.lock"

// AddPodEgress puts p's addresses under PodEgressTable, creating the table
// on first use. A connection the pod already holds is not cut.
func AddPodEgress(ctx context.Context, p PodEgress) error {
	if len(p.Addrs) == 0 {
		return fmt.Errorf("pod egress: the pod has no address to hold")
	}
	if err := ensurePodEgressTable(ctx); err != nil {
		return err
	}
	return nft(ctx, podEgressElements("add", p))
}

// RemovePodEgress takes p's addresses out of PodEgressTable. Addresses
// already gone are no error, so that it can run again after a crash.
func RemovePodEgress(ctx context.Context, p PodEgress) error {
	var errs []error
	// One element per transaction: a missing one fails its own only.
	for _, one := range splitPodEgress(p) {
		if err := nft(ctx, podEgressElements("delete", one)); err != nil && !strings.Contains(err.Error(), "No such file or directory") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func splitPodEgress(p PodEgress) []PodEgress {
	var out []PodEgress
	for _, a := range p.Addrs {
		out = append(out, PodEgress{Addrs: []netip.Addr{a}})
		for _, ns := range p.Nameservers {
			if ns.Is4() == a.Is4() {
				out = append(out, PodEgress{Addrs: []netip.Addr{a}, Nameservers: []netip.Addr{ns}})
			}
		}
	}
	return out
}

// podEgressElements renders the nft commands that add or delete (verb)
// p's elements. With nameservers, only the pod-nameserver pairs; without,
// the addresses themselves.
func podEgressElements(verb string, p PodEgress) string {
	var b strings.Builder
	for _, a := range p.Addrs {
		fam := "4"
		if !a.Is4() {
			fam = "6"
		}
		if len(p.Nameservers) == 0 || verb == "add" {
			fmt.Fprintf(&b, "%s element inet %s pods%s { %s }\n", verb, PodEgressTable, fam, a)
		}
		for _, ns := range p.Nameservers {
			if ns.Is4() == a.Is4() {
				fmt.Fprintf(&b, "%s element inet %s dns%s { %s . %s }\n", verb, PodEgressTable, fam, a, ns)
			}
		}
	}
	return b.String()
}

// ensurePodEgressTable creates PodEgressTable unless it exists, under a
// lock so that two shims starting pods at once make one.
func ensurePodEgressTable(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(podEgressLock), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(podEgressLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	if nft(ctx, fmt.Sprintf("list table inet %s\n", PodEgressTable)) == nil {
		return nil
	}
	return nft(ctx, renderPodEgressTable())
}

// renderPodEgressTable is the table, its sets empty. The chains run just
// before the filter priority, so a packet they drop is dropped whatever
// the node's other tables (kube-proxy's, the CNI's) accept; new
// connections from a held pod pass only to public addresses, and to the
// node only for DNS to its nameservers.
func renderPodEgressTable() string {
	var d4, d6 []string
	for _, p := range policy.DeniedRanges {
		d4 = append(d4, p.String())
	}
	for _, p := range policy.DeniedRanges6 {
		d6 = append(d6, p.String())
	}
	return fmt.Sprintf(`table inet %[1]s {
	set pods4 { type ipv4_addr; }
	set pods6 { type ipv6_addr; }
	set dns4 { type ipv4_addr . ipv4_addr; }
	set dns6 { type ipv6_addr . ipv6_addr; }
	set denied4 { type ipv4_addr; flags interval; elements = { %[2]s } }
	set denied6 { type ipv6_addr; flags interval; elements = { %[3]s } }
	chain held {
		ct state established,related accept
		meta l4proto { tcp, udp } th dport 53 ip saddr . ip daddr @dns4 accept
		meta l4proto { tcp, udp } th dport 53 ip6 saddr . ip6 daddr @dns6 accept
	}
	chain forward {
		type filter hook forward priority filter - 5; policy accept;
		ip saddr @pods4 jump held
		ip6 saddr @pods6 jump held
		ip saddr @pods4 ip daddr @denied4 drop
		ip saddr @pods4 ip daddr @pods4 drop
		ip6 saddr @pods6 drop
	}
	chain input {
		type filter hook input priority filter - 5; policy accept;
		ip saddr @pods4 jump held
		ip6 saddr @pods6 jump held
		ip saddr @pods4 drop
		ip6 saddr @pods6 drop
	}
}
`, PodEgressTable, strings.Join(d4, ", "), strings.Join(d6, ", "))
}

// NetnsAddrs lists the global unicast addresses of the network namespace
// at path: a pod's own addresses, which its CNI plugin gave it.
func NetnsAddrs(path string) ([]netip.Addr, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses in %s: %w", path, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
