package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// testWorld is a test host in a network namespace of the test's own,
// reached from the host through a veth pair and host routes. Every address
// a sandbox must not reach is made an address of this host first, so that
// a broken policy reaches it and never a real network.
type testWorld struct {
	t      *testing.T
	ns     string
	hostIf string
	// hostSide is the host's address on the test link; testHost the test
	// host's (a private address).
	hostSide, testHost string
	// public is reachable in open mode; other is a public address that
	// allow rules never name. metadata is the cloud metadata address.
	public, other, metadata string
	routes                  []string
}

const metadataIP = "169.254.169.254"

func newTestWorld(t *testing.T) *testWorld {
	t.Helper()
	n := rand.IntN(200) + 20
	w := &testWorld{
		t: t, ns: fmt.Sprintf("hutchtest-%d", n), hostIf: fmt.Sprintf("hutchtw%d", n),
		hostSide: fmt.Sprintf("10.99.%d.1", n), testHost: fmt.Sprintf("10.99.%d.2", n),
		public: fmt.Sprintf("203.0.113.%d", n), other: fmt.Sprintf("198.51.100.%d", n),
		metadata: metadataIP,
	}
	t.Cleanup(w.close)
	w.ip("netns", "add", w.ns)
	w.ip("link", "add", w.hostIf, "type", "veth", "peer", "name", "eth0", "netns", w.ns)
	w.ip("addr", "add", w.hostSide+"/30", "dev", w.hostIf)
	w.ip("link", "set", w.hostIf, "up")
	for _, a := range []string{w.testHost + "/30", w.public + "/32", w.other + "/32", w.metadata + "/32"} {
		w.ip("-n", w.ns, "addr", "add", a, "dev", "eth0")
	}
	w.ip("-n", w.ns, "link", "set", "eth0", "up")
	w.ip("-n", w.ns, "link", "set", "lo", "up")
	w.ip("-n", w.ns, "route", "add", "default", "via", w.hostSide)
	for _, a := range []string{w.public, w.other, w.metadata} {
		w.ip("route", "replace", a+"/32", "via", w.testHost)
		w.routes = append(w.routes, a+"/32")
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// An HTTP server on every address of the test host, saying which.
	www := t.TempDir()
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte("testhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"80", "8080"} {
		httpd := exec.Command("ip", "netns", "exec", w.ns, "busybox", "httpd", "-f", "-p", port, "-h", www)
		if err := httpd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { httpd.Process.Kill(); httpd.Wait() })
	}
	w.serveDNS(map[string]string{
		"allowed.test.":  w.public,
		"api.wild.test.": w.public,
		// A site the rules never name, on allowed.test's address, as
		// on a CDN.
		"neighbour.test.":       w.public,
		"denied.test.":          w.other,
		"private.allowed.test.": w.testHost,
	})
	return w
}

func (w *testWorld) ip(args ...string) {
	w.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		w.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (w *testWorld) close() {
	for _, r := range w.routes {
		exec.Command("ip", "route", "del", r).Run()
	}
	exec.Command("ip", "link", "del", w.hostIf).Run()
	exec.Command("ip", "netns", "del", w.ns).Run()
}

// serveDNS answers A queries for names from a socket inside the test
// host's namespace, at testHost:53.
func (w *testWorld) serveDNS(names map[string]string) {
	w.t.Helper()
	conn := w.listenInNetns("udp", net.JoinHostPort(w.testHost, "53"))
	srv := &dns.Server{PacketConn: conn.(net.PacketConn), Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		ip, ok := names[strings.ToLower(q.Question[0].Name)]
		switch {
		case !ok:
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.ParseIP(ip),
			})
		}
		rw.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	w.t.Cleanup(func() { srv.Shutdown() })
}

// listenInNetns opens a socket inside the test host's namespace.
func (w *testWorld) listenInNetns(network, addr string) any {
	w.t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		w.t.Fatal(err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(w.ns)
	if err != nil {
		w.t.Fatal(err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		w.t.Fatal(err)
	}
	defer netns.Set(orig)
	if network == "udp" {
		c, err := net.ListenPacket("udp4", addr)
		if err != nil {
			w.t.Fatal(err)
		}
		return c
	}
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// probe runs a TCP connect + HTTP GET (naming host as its Host) from
// inside sandbox id to host:port, bounded to 5 s, and reports whether the
// test host answered.
func probe(e *env, id, host, port string) (bool, string) {
	e.t.Helper()
	r := e.run(nil, "exec", "--timeout", "10s", id, "--", "sh", "-c",
		`printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$0" | nc -w 5 "$0" "$1"`, host, port)
	return strings.Contains(r.stdout, "testhost"), r.stdout + r.stderr
}

func mustReach(t *testing.T, e *env, id, host, port string) {
	t.Helper()
	if ok, out := probe(e, id, host, port); !ok {
		t.Fatalf("sandbox could not reach %s:%s: %s", host, port, out)
	}
}

func mustNotReach(t *testing.T, e *env, id, host, port string) {
	t.Helper()
	if ok, out := probe(e, id, host, port); ok {
		t.Fatalf("sandbox reached %s:%s, which its policy denies: %s", host, port, out)
	}
}

// hostListener is a service on the host itself, on every address.
func hostListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\ntesthost\n"))
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// In mode none the sandbox has loopback only: nothing answers and connects
// fail at once.
func TestNetworkNone(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	id := e.create()
	if out := e.ok("exec", id, "--", "cat", "/proc/net/dev"); strings.Contains(out, "eth0") {
		t.Fatalf("a sandbox in mode none has an interface besides lo:\n%s", out)
	}
	for _, a := range []string{w.public, w.testHost, w.metadata} {
		mustNotReach(t, e, id, a, "80")
	}
}

// In mode open the sandbox reaches public addresses, and neither cloud
// metadata, nor private ranges, nor the host, nor another sandbox.
func TestNetworkOpen(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	hostPort := hostListener(t)
	other := e.create("--net", "open")
	e.ok("exec", "-d", other, "--", "busybox", "httpd", "-p", "8080", "-h", "/etc")
	id := e.create("--net", "open", "--dns", w.testHost)
	sb := e.inspect(id)

	mustReach(t, e, id, w.public, "80")
	mustNotReach(t, e, id, w.metadata, "80")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, w.hostSide, hostPort)
	mustNotReach(t, e, id, hostGateway(sb.IP), hostPort)
	mustNotReach(t, e, id, "127.0.0.1", hostPort)
	mustNotReach(t, e, id, e.inspect(other).IP, "8080")

	// Names resolve through hutch's resolver; a name the policy allows
	// leads to a private address only where an address rule names it.
	r := e.run(nil, "exec", id, "--", "nslookup", "allowed.test")
	if r.code != 0 || !strings.Contains(r.stdout, w.public) {
		t.Fatalf("nslookup in open mode: %s", r)
	}
	e.ok("update", id, "--allow", "private.allowed.test:8080")
	mustNotReach(t, e, id, "private.allowed.test", "8080")
	e.ok("update", id, "--allow", w.testHost+":8080")
	mustReach(t, e, id, "private.allowed.test", "8080")
	mustNotReach(t, e, id, w.testHost, "80")

	e.ok("rm", "-f", id, other)
	e.assertClean(id)
	e.assertClean(other)
}

// hostGateway is the host end of a sandbox's /30 link.
func hostGateway(sandboxIP string) string {
	ip := net.ParseIP(sandboxIP).To4()
	ip[3]--
	return ip.String()
}

// In mode allow only what the rules name is reachable: allowed names
// resolve and answer, other names do not resolve, and addresses nobody
// allowed fail even when given literally.
func TestNetworkAllow(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	id := e.create("--net", "allow", "--dns", w.testHost,
		"--allow", "allowed.test", "--allow", "*.wild.test:80", "--allow", w.testHost+":8080")

	r := e.run(nil, "exec", id, "--", "nslookup", "denied.test")
	if r.code == 0 || strings.Contains(r.stdout, w.other) {
		t.Fatalf("a denied name resolved: %s", r)
	}
	mustNotReach(t, e, id, w.other, "80")
	mustNotReach(t, e, id, w.public, "80") // not yet resolved: not admitted
	mustReach(t, e, id, "allowed.test", "80")
	mustReach(t, e, id, "api.wild.test", "80")
	mustReach(t, e, id, w.testHost, "8080")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, w.metadata, "80")

	// Policy is replaced on the running sandbox.
	e.ok("update", id, "--allow", "denied.test")
	mustReach(t, e, id, "denied.test", "80")
	mustNotReach(t, e, id, w.testHost, "8080")
	e.ok("update", id, "--net", "none")
	mustNotReach(t, e, id, w.other, "80")
	if r := e.run(nil, "exec", id, "--", "nslookup", "denied.test"); r.code == 0 {
		t.Fatalf("names still resolve after update to none: %s", r)
	}
	e.ok("update", id, "--net", "open", "--clear-allow")
	mustReach(t, e, id, w.public, "80")

	e.ok("rm", "-f", id)
	e.assertClean(id)
}

func TestNetworkBadInput(t *testing.T) {
	e := newEnv(t)
	none := e.create()
	leasesBefore := len(networkLeases())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--net", "open", "--allow", "10.0.0.0/33"}, "10.0.0.0/33"},
		{[]string{"create", "--net", "allow", "--allow", "[::1]:80"}, "IPv6"},
		{[]string{"create", "--net", "allow", "--allow", "host:99999"}, "port"},
		{[]string{"create", "--net", "allow", "--allow", "nodot"}, "nodot"},
		{[]string{"create", "--allow", "example.com"}, "--allow needs --net"},
		{[]string{"create", "--net", "open", "--dns", "resolver.example"}, "--dns"},
		{[]string{"update", none, "--net", "open"}, "--net none"},
		{[]string{"update", none, "--net", "sideways"}, "sideways"},
		{[]string{"update", none}, "nothing to change"},
	} {
		before := len(e.sandboxDirs())
		assertOneLineError(t, e.run(nil, tc.args...), tc.want)
		if after := len(e.sandboxDirs()); after != before {
			t.Fatalf("%v left a sandbox behind", tc.args)
		}
	}
	if n := len(networkLeases()); n != leasesBefore {
		t.Fatalf("failed commands left network leases: %d before, %d after", leasesBefore, n)
	}
}

// networkLeases lists the host's allocated sandbox links.
func networkLeases() []string {
	m, _ := filepath.Glob("/run/hutch/net/*")
	return m
}

// Limits change on a running sandbox: the host cgroup takes the new values
// at once; what cannot change is refused.
func TestUpdateLimits(t *testing.T) {
	e := newEnv(t)
	id := e.create("--memory", "256m", "--cpus", "1")
	e.ok("update", id, "--memory", "512m", "--cpus", "0.5")
	mem, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/hutch", id, "memory.limit_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(mem)) != fmt.Sprint(512<<20) {
		t.Fatalf("memory limit after update: %s", mem)
	}
	quota, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu/hutch", id, "cpu.cfs_quota_us"))
	if strings.TrimSpace(string(quota)) != "50000" {
		t.Fatalf("cpu quota after update: %s", quota)
	}
	var rec struct {
		CPUs   float64 `json:"cpus"`
		Memory int64   `json:"memory"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", id)), &rec); err != nil || rec.CPUs != 0.5 || rec.Memory != 512<<20 {
		t.Fatalf("inspect after update: %+v %v", rec, err)
	}
	assertOneLineError(t, e.run(nil, "update", id, "--pids", "10"), "--pids")
	assertOneLineError(t, e.run(nil, "update", id, "--memory", "1k"), "--memory")
	if out := e.ok("exec", id, "--", "echo", "alive"); out != "alive\n" {
		t.Fatalf("sandbox after updates: %q", out)
	}
}

// A paused sandbox with a network resumes with it: the same address, the
// same policy, names resolving, and nothing left once it is removed.
func TestNetworkAcrossPauseResume(t *testing.T) {
	e := newEnv(t)
	w := newTestWorld(t)
	id := e.create("--net", "allow", "--dns", w.testHost, "--allow", "allowed.test", "--allow", w.testHost+":8080")
	ipBefore := e.ok("exec", id, "--", "sh", "-c", "ip -4 addr show eth0 | grep inet")
	mustReach(t, e, id, w.testHost, "8080")

	e.ok("pause", id)
	e.ok("resume", id)
	if ip := e.ok("exec", id, "--", "sh", "-c", "ip -4 addr show eth0 | grep inet"); ip != ipBefore {
		t.Fatalf("address after resume %q, before %q", ip, ipBefore)
	}
	mustReach(t, e, id, w.testHost, "8080")
	mustReach(t, e, id, "allowed.test", "80")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, w.other, "80")
	mustNotReach(t, e, id, w.metadata, "80")

	// Removed while paused: its namespace, link, table and lease go too.
	e.ok("pause", id)
	e.ok("rm", "-f", id)
	e.assertClean(id)
	for _, l := range networkLeases() {
		if b, _ := os.ReadFile(l); string(b) == id {
			t.Fatalf("lease %s still held by the removed sandbox", l)
		}
	}
	if _, err := os.Stat("/var/run/netns/hutch-" + id); err == nil {
		t.Fatalf("network namespace of the removed sandbox is left")
	}
}
