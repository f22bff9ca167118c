package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// A rootless sandbox with a network publishes ports, is forked and
// snapshotted: a published port reaches a server inside; a fork gets a
// network of its own (namespaces, slirp4netns, resolver) with its
// parent's policy, which an update changes for the fork alone, and it
// outlives its parent; a sandbox made from the snapshot gets the policy
// its create asks for; rm leaves nothing.
func TestRootlessNetworkPersist(t *testing.T) {
	e := newRootlessEnv(t)
	usableTun(t)
	w := newTestWorld(t)

	id := e.create("--net", "open", "--dns", w.testHost, "-p", "0:8080")
	mustReach(t, e, id, w.public, "80")
	mustNotReach(t, e, id, w.metadata, "80")
	// Limits stay as created: the user has no cgroup to change live.
	assertOneLineError(t, e.run(nil, "update", id, "--memory", "1g"), "--memory cannot be enforced on a running sandbox of an unprivileged user")

	// -p: through the agent, as the host cannot dial the sandbox's
	// address in namespaces the user owns.
	port := e.ports(id).Ports[0].HostPort
	e.startHTTPDPlain(id)
	waitFor(t, func() bool {
		b, err := get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		return err == nil && strings.Contains(b, "ok")
	})

	// fork
	e.ok("exec", id, "--", "sh", "-c", "echo parent > /root/mark")
	out := strings.Fields(e.ok("fork", id))
	if len(out) != 1 {
		t.Fatalf("fork printed %q", out)
	}
	child := out[0]
	if got := e.ok("exec", child, "--", "cat", "/root/mark"); got != "parent\n" {
		t.Fatalf("fork's file: %q", got)
	}
	if st := e.inspect(child).State; st != "running" {
		t.Fatalf("fork is %s", st)
	}
	// The fork has namespaces, slirp4netns and a policy of its own,
	// its parent's to begin with.
	parentProcs, childProcs := rootlessNetProcs(t, e, id), rootlessNetProcs(t, e, child)
	for _, p := range childProcs {
		if slices.Contains(parentProcs, p) {
			t.Fatalf("the fork shares its parent's network process %d", p)
		}
	}
	mustReach(t, e, child, w.public, "80")
	mustNotReach(t, e, child, w.metadata, "80")
	mustNotReach(t, e, child, w.testHost, "80")
	e.ok("update", child, "--net", "allow", "--allow", w.testHost+":8080")
	mustReach(t, e, child, w.testHost, "8080")
	mustNotReach(t, e, child, w.public, "80")
	// The parent keeps its own.
	mustReach(t, e, id, w.public, "80")
	mustNotReach(t, e, id, w.testHost, "8080")

	// snapshot, then a sandbox from it with a policy of its own.
	e.ok("snapshot", "-t", "netsnap", id)
	snap := e.create("--image", "netsnap", "--net", "allow", "--allow", "allowed.test:80", "--dns", w.testHost)
	if got := e.ok("exec", snap, "--", "cat", "/root/mark"); got != "parent\n" {
		t.Fatalf("snapshot's file: %q", got)
	}
	mustReach(t, e, snap, "allowed.test", "80")
	mustNotReach(t, e, snap, w.public, "8080")
	mustNotReach(t, e, snap, "denied.test", "80")
	mustNotReach(t, e, snap, w.metadata, "80")

	// run --rm from the snapshot, with a policy of its own.
	r := e.run(nil, "run", "--rm", "--image", "netsnap", "--net", "allow", "--allow", "allowed.test:80", "--dns", w.testHost, "--",
		"sh", "-c", `cat /root/mark; for h in allowed.test denied.test; do printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 $h 80 | grep -q testhost && echo "$h reached"; done; true`)
	if r.code != 0 || r.stdout != "parent\nallowed.test reached\n" {
		t.Fatalf("run --rm from the snapshot with --net allow: %s", r)
	}

	// The fork does not depend on its parent's namespaces.
	e.ok("rm", "-f", id)
	e.assertClean(id)
	mustReach(t, e, child, w.testHost, "8080")
	e.ok("pause", child)
	e.ok("resume", child)
	mustReach(t, e, child, w.testHost, "8080")
	mustNotReach(t, e, child, w.public, "80")
	for _, x := range []string{child, snap} {
		e.ok("rm", "-f", x)
		e.assertClean(x)
	}
}
