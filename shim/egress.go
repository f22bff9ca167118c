package shim

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/assembly"
)

// EgressPublic is the one value of AnnotationEgress and Config.Egress.
const EgressPublic = "public"

// holdEgress holds the pod, on the network namespace at netnsPath, to
// public egress on the node, when its policy asks.
func (p *pod) holdEgress(ctx context.Context, netnsPath string) error {
	if p.policy.Egress != EgressPublic || p.policy.Network != "" {
		return nil
	}
	addrs, err := assembly.NetnsAddrs(netnsPath)
	if err != nil {
		return fmt.Errorf("hold the pod's egress: %w", err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("hold the pod's egress: its network namespace %s has no address", netnsPath)
	}
	e := assembly.PodEgress{Addrs: addrs}
	if err := assembly.HoldPodEgress(ctx, e); err != nil {
		return fmt.Errorf("hold the pod's egress: %w", err)
	}
	p.egress = &e
	return nil
}

// allowNameservers lets a held pod query the nameservers of the
// resolv.conf that spec (one of its containers) mounts, which the
// kubelet wrote for the pod.
func (p *pod) allowNameservers(ctx context.Context, spec *specs.Spec) error {
	if p.egress == nil {
		return nil
	}
	var add []netip.Addr
	for _, m := range spec.Mounts {
		if m.Destination != "/etc/resolv.conf" || m.Type != "bind" {
			continue
		}
		ns, err := readNameservers(m.Source)
		if err != nil {
			return fmt.Errorf("the pod's nameservers: %w", err)
		}
		for _, a := range ns {
			if !slices.Contains(p.egress.Nameservers, a) && !slices.Contains(add, a) {
				add = append(add, a)
			}
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := assembly.HoldPodEgress(ctx, assembly.PodEgress{Addrs: p.egress.Addrs, Nameservers: add}); err != nil {
		return fmt.Errorf("let the pod query its nameservers: %w", err)
	}
	p.egress.Nameservers = append(p.egress.Nameservers, add...)
	return nil
}

// readNameservers reads the nameserver lines of a resolv.conf.
func readNameservers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			if a, err := netip.ParseAddr(fs[1]); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, sc.Err()
}
