package k8s

import (
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
)

// The test's outside world: a network namespace of its own, routed from
// the node through a veth, holding a public-looking web host at
// outsideWeb and the pods' nameserver at testDNS (which kubelet's
// resolv.conf names), which answers every A query with outsideWeb and
// also serves TCP on port 80. No packet leaves the machine.
var (
	outsideNS  = fmt.Sprintf("hutchk8s-out-%d", podNet)
	outsideIf  = fmt.Sprintf("hutchk8s%d", podNet)
	outsideWeb = fmt.Sprintf("203.0.113.%d", podNet)
	testDNS    = fmt.Sprintf("10.253.%d.53", podNet)
	outsideGW  = fmt.Sprintf("10.253.%d.1", podNet)
)

// startOutside makes the outside namespace and its servers for the test.
func startOutside(t *testing.T) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "del", outsideNS).Run() //nolint:errcheck // a leftover of a killed run
	run("ip", "netns", "add", outsideNS)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", outsideNS).Run() }) //nolint:errcheck // best effort
	run("ip", "link", "add", outsideIf, "type", "veth", "peer", "name", "eth0", "netns", outsideNS)
	t.Cleanup(func() { exec.Command("ip", "link", "del", outsideIf).Run() }) //nolint:errcheck // best effort
	run("ip", "addr", "add", outsideGW+"/24", "dev", outsideIf)
	run("ip", "link", "set", outsideIf, "up")
	in := func(args ...string) { t.Helper(); run(append([]string{"ip", "netns", "exec", outsideNS}, args...)...) }
	in("ip", "addr", "add", testDNS+"/24", "dev", "eth0")
	in("ip", "addr", "add", outsideWeb+"/32", "dev", "eth0")
	in("ip", "link", "set", "eth0", "up")
	in("ip", "link", "set", "lo", "up")
	in("ip", "route", "add", "default", "via", outsideGW)
	run("ip", "route", "add", outsideWeb+"/32", "via", testDNS)

	web := listenIn(t, "tcp", ":80")
	go serveLine(web, "outside-ok")
	pc := packetIn(t, "udp", testDNS+":53")
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		for _, q := range r.Question {
			if q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(outsideWeb)})
			}
		}
		w.WriteMsg(m) //nolint:errcheck // a lost answer is the client's timeout
	})}
	go srv.ActivateAndServe() //nolint:errcheck // ends with the test
	t.Cleanup(func() { srv.Shutdown(); web.Close() })
}

// inOutside runs f on a thread in the outside namespace: a socket made
// there stays there.
func inOutside(t *testing.T, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread dies with the goroutine, namespace and all
		ns, err := netns.GetFromName(outsideNS)
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	if err := <-done; err != nil {
		t.Fatalf("in %s: %v", outsideNS, err)
	}
}

func listenIn(t *testing.T, network, addr string) (l net.Listener) {
	t.Helper()
	inOutside(t, func() (err error) { l, err = net.Listen(network, addr); return err })
	return l
}

func packetIn(t *testing.T, network, addr string) (pc net.PacketConn) {
	t.Helper()
	inOutside(t, func() (err error) { pc, err = net.ListenPacket(network, addr); return err })
	return pc
}

// serveLine answers every connection to l with line and closes it.
func serveLine(l net.Listener, line string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Write([]byte(line + "\n")) //nolint:errcheck // the client reads what came
		c.Close()
	}
}

// A pod that keeps the pod network but is held to public egress
// (dev.hutch.egress: public, what serve gives a sandbox with network
// open) reaches the outside and its nameserver, and nothing else: not
// another pod, not the node, not a private address on the nameserver's
// host. A pod without the annotation, on the same network, reaches all
// of them, so that each refusal is the hold's.
func TestPodEgressHeldOnTheNode(t *testing.T) {
	// The NetworkPolicies shipped for clusters that enforce them are
	// ones the API server takes.
	if out, err := cl.kubectl(nil, "apply", "--dry-run=server", "-f", "../../deploy/kubernetes/networkpolicy.yaml"); err != nil {
		t.Errorf("deploy/kubernetes/networkpolicy.yaml: %v\n%s", err, out)
	}
	startOutside(t)
	allowPodToPod(t)
	node := listenAll(t)
	go serveLine(node, "node-ok")
	_, nodePort, _ := net.SplitHostPort(node.Addr().String())

	createPod(t, "egress-victim", podYAML("egress-victim", nil, "  containers:\n"+
		container("main", "while true; do echo victim-ok | nc -l -p 8080; done", "")))
	createPod(t, "egress-free", podYAML("egress-free", nil, "  containers:\n"+container("main", "exec sleep 3600", "")))
	createPod(t, "egress-held", podYAML("egress-held", map[string]string{"dev.hutch.egress": "public"}, "  containers:\n"+container("main", "exec sleep 3600", "")))
	victim := waitPod(t, "egress-victim", 3*time.Minute, "running", running)
	waitPod(t, "egress-free", 3*time.Minute, "running", running)
	held := waitPod(t, "egress-held", 3*time.Minute, "running", running)

	// try connects from pod to addr:port and reports what it read.
	try := func(pod, addr, port string) string {
		out, _ := cl.kubectl(nil, "exec", pod, "--", "sh", "-c", "nc -w 3 "+addr+" "+port+" </dev/null")
		return strings.TrimSpace(out)
	}
	targets := []struct{ what, addr, port, want string }{
		{"another pod", victim.Status.PodIP, "8080", "victim-ok"},
		{"the node", podGateway, nodePort, "node-ok"},
		{"a private address", testDNS, "80", "outside-ok"},
	}
	for _, tg := range targets {
		if got := try("egress-free", tg.addr, tg.port); got != tg.want {
			t.Fatalf("a pod without the hold reaching %s (%s:%s): %q, want %q: the test's network is broken", tg.what, tg.addr, tg.port, got, tg.want)
		}
		if got := try("egress-held", tg.addr, tg.port); got != "" {
			t.Errorf("the held pod reached %s (%s:%s): read %q", tg.what, tg.addr, tg.port, got)
		}
	}
	if got := try("egress-held", outsideWeb, "80"); got != "outside-ok" {
		t.Errorf("the held pod reaching a public address (%s:80): %q, want outside-ok", outsideWeb, got)
	}
	out, err := cl.kubectl(nil, "exec", "egress-held", "--", "nslookup", "pypi.test")
	if err != nil || !strings.Contains(out, outsideWeb) {
		t.Errorf("the held pod's DNS through its nameserver %s: %v\n%s", testDNS, err, out)
	}

	// The hold goes with the pod.
	cl.kubectl(nil, "delete", "pod", "egress-held", "--grace-period=1", "--timeout=90s") //nolint:errcheck // checked below
	waitGone(t, "egress-held", 90*time.Second)
	// nft get element fails for an element the set does not hold.
	if out, err := exec.Command("nft", "get", "element", "inet", "hutch_pods", "pods4", "{ "+held.Status.PodIP+" }").CombinedOutput(); err == nil {
		t.Errorf("the deleted pod's address %s is still held:\n%s", held.Status.PodIP, out)
	}
}

// listenAll listens on every address of the node on a free port, for
// the pods to reach it through their gateway.
func listenAll(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
