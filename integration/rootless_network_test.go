package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// usableTun makes /dev/net/tun usable by every user for the test, as
// udev's default rule does on a desktop or server (mode 0666), and puts
// the mode back after.
func usableTun(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("slirp4netns"); err != nil {
		t.Fatal("rootless networking needs slirp4netns (scripts/install-deps.sh)")
	}
	fi, err := os.Stat("/dev/net/tun")
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o666 {
		if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod("/dev/net/tun", mode) })
	}
}

// rootlessNetProcs are the processes a rootless sandbox's network runs
// on the host, as its state directory records them.
func rootlessNetProcs(t *testing.T, e *env, id string) []int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(e.root, "sandboxes", id+"*", "usernet.json"))
	if len(files) != 1 {
		t.Fatalf("no rootless network state for %s under %s", id, e.root)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range st {
		pids = append(pids, p.Pid)
	}
	if len(pids) != 3 {
		t.Fatalf("rootless network state %s: %s", files[0], b)
	}
	return pids
}

// An unprivileged user's sandbox gets the same network policy as root's:
// in open mode it reaches a public address and neither cloud metadata, nor
// private ranges, nor the host by any of its addresses; in allow mode only
// what the rules name; update changes a running sandbox's policy; rm
// leaves nothing. The test hosts are the root tests' (a namespace with
// public addresses routed to it), so no packet leaves the machine.
func TestRootlessNetwork(t *testing.T) {
	e := newRootlessEnv(t)
	usableTun(t)
	w := newTestWorld(t)
	hostPort := hostListener(t)
	// A public-looking address of the host itself: user-mode networking
	// connects from the host, so only the firewall keeps the sandbox off
	// the host's services there.
	var n int
	fmt.Sscanf(w.public, "203.0.113.%d", &n)
	hostPublic := "203.0.113." + strconv.Itoa(n+1)
	w.ip("addr", "add", hostPublic+"/32", "dev", w.hostIf)

	id := e.create("--net", "open", "--dns", w.testHost)
	procs := rootlessNetProcs(t, e, id)
	mustReach(t, e, id, w.public, "80")
	mustNotReach(t, e, id, w.metadata, "80")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, w.hostSide, hostPort)
	mustNotReach(t, e, id, hostPublic, hostPort)
	mustNotReach(t, e, id, "10.0.2.2", hostPort) // slirp4netns's alias of the host
	mustNotReach(t, e, id, "10.0.2.3", "53")     // its DNS forwarder
	mustNotReach(t, e, id, hostGateway(e.inspect(id).IP), hostPort)
	r := e.run(nil, "exec", id, "--", "nslookup", "allowed.test")
	if r.code != 0 || !strings.Contains(r.stdout, w.public) {
		t.Fatalf("nslookup in a rootless sandbox: %s", r)
	}

	// update, live: allow mode with a name rule, then an address rule
	// for a private address.
	e.ok("update", id, "--net", "allow", "--allow", "allowed.test:80")
	mustNotReach(t, e, id, w.public, "80") // not resolved yet: not admitted
	mustReach(t, e, id, "allowed.test", "80")
	mustNotReach(t, e, id, "allowed.test", "8080")
	mustNotReach(t, e, id, "denied.test", "80")
	mustNotReach(t, e, id, w.other, "80")
	e.ok("update", id, "--allow", w.testHost+":8080")
	mustReach(t, e, id, w.testHost, "8080")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, hostPublic, hostPort)

	// Pause ends the sandbox's network processes; resume makes them
	// again, with the policy it had.
	e.ok("pause", id)
	e.ok("resume", id)
	mustReach(t, e, id, w.testHost, "8080")
	mustNotReach(t, e, id, w.other, "80")
	procs = append(procs, rootlessNetProcs(t, e, id)...)

	e.ok("rm", "-f", id)
	e.assertClean(id)
	for _, pid := range procs {
		// A zombie is gone, waiting for its new parent to reap it.
		if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
			t.Errorf("process of the sandbox's network outlived rm: %s", st)
		}
	}

	// Created in allow mode from the start.
	id = e.create("--net", "allow", "--allow", "api.wild.test", "--dns", w.testHost)
	mustReach(t, e, id, "api.wild.test", "8080")
	mustNotReach(t, e, id, "denied.test", "80")
	mustNotReach(t, e, id, w.metadata, "80")
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
