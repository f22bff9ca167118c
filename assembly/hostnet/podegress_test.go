package hostnet

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestPodEgressElements(t *testing.T) {
	p := PodEgress{
		Addrs:       []netip.Addr{netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00::5")},
		Nameservers: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
	}
	want := "add element inet hutch_pods pods4 { 10.244.1.5 }\n" +
		"add element inet hutch_pods dns4 { 10.244.1.5 . 10.96.0.10 }\n" +
		"add element inet hutch_pods pods6 { fd00::5 }\n"
	if got := podEgressElements("add", p); got != want {
		t.Errorf("add:\n%s\nwant:\n%s", got, want)
	}
	// A removal takes each element in its own transaction, so that one
	// already gone fails alone.
	var dels []string
	for _, one := range splitPodEgress(p) {
		dels = append(dels, podEgressElements("delete", one))
	}
	wantDels := []string{
		"delete element inet hutch_pods pods4 { 10.244.1.5 }\n",
		"delete element inet hutch_pods dns4 { 10.244.1.5 . 10.96.0.10 }\n",
		"delete element inet hutch_pods pods6 { fd00::5 }\n",
	}
	if strings.Join(dels, "|") != strings.Join(wantDels, "|") {
		t.Errorf("delete: %q, want %q", dels, wantDels)
	}
}

// The table is one nft accepts (nft -c needs root and nft; the
// Kubernetes test loads it for real).
func TestPodEgressTableParses(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and nft")
	}
	c := exec.Command("nft", "-c", "-f", "-")
	c.Stdin = strings.NewReader(renderPodEgressTable())
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s", err, out)
	}
}
