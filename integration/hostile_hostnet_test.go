package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"hutch.dev/hutch/assembly/hostnet"
)

// floodDNS serves the attacker's wildcard zone at the test world's other
// public address: every A query is answered with the public address, so
// that each query of a flood makes the sandbox's resolver admit an
// address.
func (w *testWorld) floodDNS() string {
	w.t.Helper()
	conn := w.listenInNetns("udp", net.JoinHostPort(w.other, "53"))
	srv := &dns.Server{PacketConn: conn.(net.PacketConn), Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.ParseIP(w.public),
			})
		}
		rw.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	w.t.Cleanup(func() { srv.Shutdown() })
	return w.other
}

// resolverOf finds the host process serving sandbox id's DNS.
func resolverOf(t *testing.T, id string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(b), "\x00")
		if slices.Contains(args, "__dns-resolver") && strings.Contains(string(b), id) {
			return pid
		}
	}
	t.Fatalf("no resolver process for %s", id)
	return 0
}

// countFDs and countThreads read what process pid holds.
func countFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

func countThreads(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// countChildren counts the host's processes named comm whose parent is
// ppid.
func countChildren(ppid int, comm string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var name string
		parent := -1
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Name:"); ok {
				name = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(l, "PPid:"); ok {
				parent, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if name == comm && parent == ppid {
			n++
		}
	}
	return n
}

// A sandbox floods its resolver with queries for names that all resolve
// and are all allowed (each answer is an admission into its firewall).
// The resolver runs on the host, outside the sandbox's gVisor: its
// sockets, threads and the processes it starts stay bounded, it is
// accounted to the sandbox's cgroup, and a neighbour's exec keeps its
// pace.
func TestHostileResolverFlood(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	ns := w.floodDNS()
	flood := buildTool(t, "./dnsflood")
	id := e.create("--image", "busybox", "--net", "allow", "--dns", ns, "--allow", "*.flood.test:80")
	e.copyIn(id, flood, "/dnsflood")
	neighbour := e.create("--image", "busybox")
	pid := resolverOf(t, id)

	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(cg), "/hutch/"+id) {
		t.Fatalf("the resolver is not in the sandbox's cgroup:\n%s", cg)
	}

	execTime := func() time.Duration {
		var ds []time.Duration
		for i := 0; i < 5; i++ {
			start := time.Now()
			e.ok("exec", neighbour, "--", "true")
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	before := execTime()

	// 20 s at most, as fast as the sandbox can send, from 8 senders.
	cmd := e.cmd(nil, "exec", id, "--", "/dnsflood", "-suffix", "flood.test", "-senders", "8", "-for", "15s")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	maxFDs, maxThreads, maxNft := 0, 0, 0
	var during time.Duration
	deadline := time.After(25 * time.Second)
sample:
	for i := 0; ; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("flood: %v: %s", err, out.String())
			}
			break sample
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("flood did not end: %s", out.String())
		case <-time.After(200 * time.Millisecond):
		}
		maxFDs, maxThreads = max(maxFDs, countFDs(pid)), max(maxThreads, countThreads(pid))
		maxNft = max(maxNft, countChildren(pid, "nft"))
		if i == 10 {
			during = execTime()
		}
	}
	t.Logf("flood: %s; resolver peak: %d fds, %d threads, %d nft processes; neighbour exec p50 %v before, %v during",
		strings.TrimSpace(out.String()), maxFDs, maxThreads, maxNft, before, during)
	if !strings.Contains(out.String(), "sent") {
		t.Fatalf("the flood sent nothing: %s", out.String())
	}
	if maxFDs > 64 {
		t.Errorf("the resolver held %d file descriptors under the flood", maxFDs)
	}
	// Each query in flight may hold a thread (waiting for the policy's
	// lock); the Go runtime adds a few of its own.
	if maxThreads > 32+16 {
		t.Errorf("the resolver ran %d threads under the flood", maxThreads)
	}
	if maxNft > 0 {
		t.Errorf("the resolver ran %d nft processes at once under the flood", maxNft)
	}
	if during > 4*before+500*time.Millisecond {
		t.Errorf("a neighbour's exec took %v during the flood, %v before", during, before)
	}
	// The resolver still serves its sandbox afterwards.
	if r := e.run(nil, "exec", id, "--", "nslookup", "after.flood.test"); r.code != 0 || !strings.Contains(r.stdout, w.public) {
		t.Fatalf("resolver after the flood: %s", r)
	}
}

// buildTool builds a program under integration/, static, for the sandbox.
func buildTool(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v: %s", pkg, err, b)
	}
	return out
}

// Sandboxes need IPv4 forwarding, a host-wide switch. On a host that did
// not route before, turning it on must not make the host a router between
// interfaces that are not hutch's: two networks on either side of the host
// stay apart while a sandbox with a network runs.
func TestHostileForwardingGuard(t *testing.T) {
	e := newEnv(t)
	n := 100 + time.Now().Nanosecond()%100
	type side struct{ ns, hostIf, hostIP, addr string }
	a := side{fmt.Sprintf("fwa-%d", n), fmt.Sprintf("fwa%d", n), fmt.Sprintf("10.98.%d.1", n), fmt.Sprintf("10.98.%d.2", n)}
	b := side{fmt.Sprintf("fwb-%d", n), fmt.Sprintf("fwb%d", n), fmt.Sprintf("10.97.%d.1", n), fmt.Sprintf("10.97.%d.2", n)}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, s := range []side{a, b} {
		t.Cleanup(func() {
			exec.Command("ip", "link", "del", s.hostIf).Run()
			exec.Command("ip", "netns", "del", s.ns).Run()
		})
		ip("netns", "add", s.ns)
		ip("link", "add", s.hostIf, "type", "veth", "peer", "name", "eth0", "netns", s.ns)
		ip("addr", "add", s.hostIP+"/30", "dev", s.hostIf)
		ip("link", "set", s.hostIf, "up")
		ip("-n", s.ns, "addr", "add", s.addr+"/30", "dev", "eth0")
		ip("-n", s.ns, "link", "set", "eth0", "up")
		ip("-n", s.ns, "route", "add", "default", "via", s.hostIP)
	}
	ping := func() bool {
		return exec.Command("ip", "netns", "exec", a.ns, "ping", "-c", "1", "-W", "1", b.addr).Run() == nil
	}
	// A host that does not route: a and b cannot reach each other.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644); err != nil {
		t.Fatal(err)
	}
	exec.Command("nft", "delete", "table", "inet", "hutch_forward").Run()
	if ping() {
		t.Fatal("a reaches b with forwarding off")
	}
	id := e.create("--image", "busybox", "--net", "open")
	if b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("a sandbox with a network did not turn forwarding on")
	}
	if ping() {
		t.Fatal("with a sandbox running, the host routes between networks that are not hutch's")
	}
	// The sandbox itself still gets its traffic forwarded.
	w := newTestWorld(t)
	mustReach(t, e, id, w.public, "80")
	if ping() {
		t.Fatal("the host routes between networks that are not hutch's")
	}
}

// The shim names host interfaces and tables after the containerd ID,
// which its caller chooses: two IDs that share a long prefix each get
// their own link and table, and removing one leaves the other's network
// working.
func TestHostileShimIDCollision(t *testing.T) {
	c := newContainerd(t)
	c.importBusybox("default")
	c.setShimConfig(`network = "open"`)
	first, second := "collide-0123456789abcdef-first", "collide-0123456789abcdef-second"
	for _, id := range []string{first, second} {
		c.ctrOK("default", "run", "-d", "--runtime", hutchRuntime, "--runtime-config-path", c.shimConfig,
			"--annotation", "dev.hutch.network=open", "busybox:latest", id, "sh", "-c", "while true; do sleep 1; done")
	}
	hasLink := func(id string) bool {
		r := c.ctr("default", "task", "exec", "--exec-id", "probe"+strconv.Itoa(time.Now().Nanosecond()), id, "ip", "-4", "addr")
		return r.code == 0 && strings.Contains(r.stdout, "inet 10.200.")
	}
	if !hasLink(first) || !hasLink(second) {
		t.Fatal("both tasks should have their own link")
	}
	c.ctrOK("default", "task", "delete", "-f", second)
	c.ctrOK("default", "container", "delete", second)
	waitFor(t, func() bool { return len(hostnet.Leftovers(context.Background(), second)) == 0 })
	if !hasLink(first) {
		t.Fatal("removing the second task took the first one's network")
	}
	c.ctrOK("default", "task", "delete", "-f", first)
	c.ctrOK("default", "container", "delete", first)
	c.assertClean(first)
}
