package assembly

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"hutch.dev/hutch/assembly/hostnet"
	"hutch.dev/hutch/policy"
)

// needHostNetwork skips unless the test may change the host's network: as
// root with nft, which `make test` has.
func needHostNetwork(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("changes the host's network: run as root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed")
	}
}

func testID(t *testing.T) string {
	b := make([]byte, 16)
	rand.Read(b) //nolint:errcheck // never fails
	return hex.EncodeToString(b)
}

// The host side both front ends get: namespace, link, firewall, a resolv.conf
// naming a resolver that answers by the policy, and a teardown that leaves
// nothing, for a resolver in this process (the shim's) and one in a
// process of its own (the CLI's).
func TestSetupNetwork(t *testing.T) {
	needHostNetwork(t)
	for _, tc := range []struct {
		name string
		r    func(t *testing.T) Resolver
	}{
		{"in process", func(*testing.T) Resolver { return ResolverInProcess{} }},
		{"process", func(t *testing.T) Resolver {
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv(resolverHelperEnv, "1")
			return ResolverProcess{Exe: exe}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			id := testID(t)
			dir := t.TempDir()
			allow, err := policy.ParseAllowList([]string{"allowed.test:443"})
			if err != nil {
				t.Fatal(err)
			}
			n, err := SetupNetwork(ctx, NetworkSpec{ID: id, Dir: dir, Mode: policy.NetAllow, Allow: allow,
				DNS: []string{"127.0.0.1"}}, tc.r(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { TeardownNetwork(ctx, id, n.Resolver, false) }) //nolint:errcheck // checked below
			if _, err := os.Stat(n.NetnsPath); err != nil {
				t.Fatalf("namespace: %v", err)
			}
			if len(n.Mounts) != 1 || n.Mounts[0].Destination != "/etc/resolv.conf" {
				t.Fatalf("mounts %+v", n.Mounts)
			}
			conf, err := os.ReadFile(n.Mounts[0].Source)
			if err != nil {
				t.Fatal(err)
			}
			ns, ok := strings.CutPrefix(strings.TrimSpace(string(conf)), "nameserver ")
			if !ok || net.ParseIP(ns) == nil {
				t.Fatalf("resolv.conf %q", conf)
			}
			// A name the policy does not allow is refused by the resolver
			// itself, without asking upstream.
			q := new(dns.Msg)
			q.SetQuestion("denied.test.", dns.TypeA)
			c := &dns.Client{Timeout: 2 * time.Second}
			resp, _, err := c.Exchange(q, net.JoinHostPort(ns, "53"))
			if err != nil {
				t.Fatalf("resolver: %v", err)
			}
			if resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0 {
				t.Fatalf("denied name answered: %v", resp)
			}
			pid, start := n.Resolver.Pid, n.Resolver.Start
			if err := TeardownNetwork(ctx, id, n.Resolver, false); err != nil {
				t.Fatal(err)
			}
			if left := hostnet.Leftovers(ctx, id); len(left) > 0 {
				t.Fatalf("left after teardown: %v", left)
			}
			if pid != 0 && SameProcess(pid, start) {
				t.Fatalf("resolver process %d still runs after teardown", pid)
			}
			// Nor is it left a zombie of this process.
			for i := 0; pid != 0; i++ {
				if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
					break
				}
				if i == 100 {
					t.Fatalf("resolver process %d was never reaped", pid)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// resolverHelperEnv makes the test binary the resolver process of
// TestSetupNetwork, with the configuration file as its last argument.
const resolverHelperEnv = "HUTCH_ASSEMBLY_TEST_RESOLVER"

func TestMain(m *testing.M) {
	if os.Getenv(resolverHelperEnv) == "1" {
		hostnet.ServeResolver(context.Background(), os.Args[len(os.Args)-1], hostnet.ReadyPipe()) //nolint:errcheck // killed
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A set-up that fails partway leaves nothing behind: not the namespace,
// the link, the table or the address lease.
func TestSetupNetworkFailureLeavesNothing(t *testing.T) {
	needHostNetwork(t)
	ctx := context.Background()
	id := testID(t)
	_, err := SetupNetwork(ctx, NetworkSpec{ID: id, Dir: filepath.Join(t.TempDir(), "missing"), Mode: policy.NetOpen},
		ResolverInProcess{})
	if err == nil {
		t.Fatal("set-up in a missing directory succeeded")
	}
	if left := hostnet.Leftovers(ctx, id); len(left) > 0 {
		t.Fatalf("left after a failed set-up: %v", left)
	}
}
