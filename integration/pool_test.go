package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// poolInfo is the part of `hutch pool ls --format json` the tests read.
type poolInfo struct {
	Name    string   `json:"name"`
	Size    int      `json:"size"`
	Ready   int      `json:"ready"`
	Members []string `json:"members"`
	Error   string   `json:"error"`
}

func (e *env) pool(name string) (poolInfo, bool) {
	e.t.Helper()
	var all []poolInfo
	if err := json.Unmarshal([]byte(e.ok("pool", "ls", "--format", "json")), &all); err != nil {
		e.t.Fatalf("pool ls --format json: %v", err)
	}
	for _, p := range all {
		if p.Name == name {
			return p, true
		}
	}
	return poolInfo{}, false
}

// waitPoolFull waits until pool name has all its sandboxes ready and
// returns it.
func (e *env) waitPoolFull(name string) poolInfo {
	e.t.Helper()
	var p poolInfo
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var ok bool
		if p, ok = e.pool(name); !ok {
			e.t.Fatalf("pool %s is gone", name)
		}
		if p.Ready == p.Size {
			return p
		}
	}
	e.t.Fatalf("pool %s did not refill within 60s: %+v", name, p)
	return p
}

// removePools removes every pool of the env at the end of a test, before
// the env's sandboxes are.
func (e *env) removePools() {
	e.t.Cleanup(func() {
		var all []poolInfo
		json.Unmarshal([]byte(e.run(nil, "pool", "ls", "--format", "json").stdout), &all) //nolint:errcheck // best effort
		for _, p := range all {
			e.run(nil, "pool", "rm", p.Name)
		}
	})
}

// A create that matches a pool takes one of its sandboxes, which then has
// everything the create asked for and nothing of the pool's; the pool
// refills.
func TestPoolClaim(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "2", "--memory", "256m", "--wait")
	p := e.waitPoolFull("warm")
	if len(p.Members) != 2 {
		t.Fatalf("pool members: %v, want 2", p.Members)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("ls shows the pool's sandboxes as the user's: %+v", all)
	}

	secret := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	id := e.create("--memory", "256m", "--name", "claimed", "--label", "team=blue",
		"--env", "GREETING=hello", "--secret", "TOKEN=@"+secret)
	if !slices.Contains(p.Members, id) {
		t.Fatalf("create made %s, not one of the pool's %v", id, p.Members)
	}
	if q, _ := e.pool("warm"); slices.Contains(q.Members, id) {
		t.Fatalf("claimed sandbox %s is still in the pool: %+v", id, q)
	}

	var sb struct {
		Name    string            `json:"name"`
		State   string            `json:"state"`
		Memory  int64             `json:"memory"`
		Labels  map[string]string `json:"labels"`
		Env     []string          `json:"env"`
		Secrets []string          `json:"secrets"`
		Created time.Time         `json:"created"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", id)), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Name != "claimed" || sb.State != "running" || sb.Memory != 256<<20 ||
		!maps.Equal(sb.Labels, map[string]string{"team": "blue"}) || !slices.Contains(sb.Env, "GREETING=hello") ||
		!slices.Equal(sb.Secrets, []string{"TOKEN"}) || sb.Created.Before(before.Add(-time.Second)) {
		t.Fatalf("inspect of the claimed sandbox: %+v", sb)
	}
	all := e.list()
	if len(all) != 1 || all[0].ID != id || all[0].Name != "claimed" {
		t.Fatalf("ls: %+v, want only %s (claimed)", all, id)
	}

	// Never used: only its init has run in it (ps, before any exec).
	ps := strings.Split(strings.TrimSpace(e.ok("ps", id)), "\n")
	if len(ps) != 2 || !strings.Contains(ps[1], "hutch-init") {
		t.Fatalf("processes of the claimed sandbox before any exec:\n%s", strings.Join(ps, "\n"))
	}
	fresh := e.create("--memory", "512m")
	if slices.Contains(p.Members, fresh) {
		t.Fatalf("a create of another memory limit took pooled sandbox %s", fresh)
	}
	if out := e.ok("exec", id, "--", "ls", "-A", "/tmp"); strings.TrimSpace(out) != "" {
		t.Errorf("/tmp of the claimed sandbox is not empty: %q", out)
	}

	got := e.ok("exec", id, "--", "sh", "-c",
		`echo "$GREETING $TOKEN $(cat /run/secrets/TOKEN) $(hostname)"; grep MemTotal /proc/meminfo`)
	want := fmt.Sprintf("hello s3cr3t s3cr3t %s\nMemTotal:         262144 kB\n", id[:12])
	if got != want {
		t.Errorf("claimed sandbox's env, secret, hostname and memory:\n%q\nwant\n%q", got, want)
	}
	if lim, err := os.ReadFile("/sys/fs/cgroup/memory/hutch/" + id + "/memory.limit_in_bytes"); err == nil {
		if strings.TrimSpace(string(lim)) != fmt.Sprint(256<<20) {
			t.Errorf("host cgroup memory limit of the claimed sandbox: %s", lim)
		}
	} else if lim, err := os.ReadFile("/sys/fs/cgroup/hutch/" + id + "/memory.max"); err != nil || strings.TrimSpace(string(lim)) != fmt.Sprint(256<<20) {
		t.Errorf("host cgroup memory limit of the claimed sandbox: %q %v", lim, err)
	}

	// The pool refills, with sandboxes it never handed out.
	q := e.waitPoolFull("warm")
	if slices.Contains(q.Members, id) {
		t.Fatalf("refilled pool holds the claimed sandbox again: %+v", q)
	}
	e.ok("rm", "-f", id, fresh)
	e.assertClean(id)
}

// hutch run takes a pooled sandbox and runs its command in it, with the
// run's environment; with --rm the sandbox goes, without it the sandbox
// stays, listed and running as a fresh one would be.
func TestPoolRun(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "1", "--wait")
	p := e.waitPoolFull("warm")
	out := e.ok("run", "--rm", "--image", "busybox", "--env", "GREETING=hello", "--", "sh", "-c", `hostname; echo "$GREETING"`)
	if want := p.Members[0][:12] + "\nhello\n"; out != want {
		t.Fatalf("run from the pool printed %q, want %q (pool members %v)", out, want, p.Members)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("run --rm left %+v", all)
	}
	e.assertClean(p.Members[0])

	q := e.waitPoolFull("warm")
	if slices.Contains(q.Members, p.Members[0]) {
		t.Fatalf("refilled pool holds the claimed sandbox again: %+v", q)
	}
	host := strings.TrimSpace(e.ok("run", "--image", "busybox", "--", "hostname"))
	all := e.list()
	if len(all) != 1 || all[0].ID != q.Members[0] || host != all[0].ID[:12] || all[0].State != "running" {
		t.Fatalf("after run without --rm: ls %+v, hostname %q; want %s running", all, host, q.Members[0])
	}
	e.ok("rm", "-f", all[0].ID)
	e.assertClean(all[0].ID)
}

// Concurrent creates against a smaller pool all succeed, each with a
// sandbox of its own.
func TestPoolConcurrentClaims(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "3", "--memory", "256m", "--wait")
	p := e.waitPoolFull("warm")

	const n = 10
	ids := make([]string, n)
	errs := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := e.run(nil, "create", "--image", "busybox", "--memory", "256m", "--name", fmt.Sprintf("c%d", i))
			if r.code != 0 {
				errs[i] = r.String()
				return
			}
			ids[i] = strings.TrimSpace(r.stdout)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != "" {
			t.Fatalf("create c%d: %s", i, err)
		}
	}
	seen := map[string]bool{}
	pooled := 0
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("two creates got sandbox %s: %v", id, ids)
		}
		seen[id] = true
		if slices.Contains(p.Members, id) {
			pooled++
		}
	}
	if pooled == 0 {
		t.Errorf("none of the creates took one of the pool's sandboxes %v: %v", p.Members, ids)
	}
	all := e.list()
	if len(all) < n {
		t.Fatalf("ls shows %d sandboxes, want %d: %+v", len(all), n, all)
	}
	for i, id := range ids {
		if r := e.inspect(id); r.Name != fmt.Sprintf("c%d", i) || r.State != "running" {
			t.Errorf("sandbox %s: %+v, want c%d running", id, r, i)
		}
	}
	e.waitPoolFull("warm")
}

// pool rm removes the pool and every sandbox of it, one being booted
// included.
func TestPoolRemoveLeavesNothing(t *testing.T) {
	e := newEnv(t)
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "2", "--wait")
	p := e.waitPoolFull("warm")
	// A claim starts a refill; remove the pool while it may be booting.
	id := e.create("--name", "mine")
	e.ok("pool", "rm", "warm")
	if _, ok := e.pool("warm"); ok {
		t.Fatal("pool ls still shows the removed pool")
	}
	for _, m := range p.Members {
		if m != id {
			e.assertClean(m)
		}
	}
	if all := e.list(); len(all) != 1 || all[0].ID != id {
		t.Fatalf("ls after pool rm: %+v, want only %s", all, id)
	}
	if r := e.inspect(id); r.State != "running" {
		t.Fatalf("the claimed sandbox after pool rm: %+v", r)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
	ents, _ := os.ReadDir(filepath.Join(e.root, "sandboxes"))
	if len(ents) != 0 {
		t.Errorf("sandbox state left after pool rm: %v", ents)
	}
	// A filler started by the claim may be starting: it ends at once.
	var left []string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if left = processesMentioning(e.root); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("processes of the root left after pool rm:\n%s", strings.Join(left, "\n"))
	}
	if r := e.run(nil, "pool", "rm", "warm"); r.code != 125 || !strings.Contains(r.stderr, "no such pool") {
		t.Errorf("pool rm of a missing pool: %s", r)
	}
}

// Creates the pool cannot serve create fresh sandboxes and leave the pool
// alone; bad pool requests are refused, leaving nothing.
func TestPoolNoMatch(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	e.ok("image", "import", "other", filepath.Join(e.bin, "images", "busybox.tar"))
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "1", "--wait")
	p := e.waitPoolFull("warm")
	for _, args := range [][]string{
		{"--image", "other"},
		{"--image", "busybox", "--memory", "512m"},
		{"--image", "busybox", "--pids", "100"},
		{"--image", "busybox", "--net", "open"},
	} {
		id := strings.TrimSpace(e.ok(append([]string{"create"}, args...)...))
		if slices.Contains(p.Members, id) {
			t.Errorf("create %v took pooled sandbox %s", args, id)
		}
		if q, _ := e.pool("warm"); !slices.Equal(q.Members, p.Members) {
			t.Errorf("create %v changed the pool: %v, was %v", args, q.Members, p.Members)
		}
		e.ok("rm", "-f", id)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pool", "create", "warm", "--image", "busybox", "--size", "1"}, "exists"},
		{[]string{"pool", "create", "bad/name", "--image", "busybox", "--size", "1"}, "pool name"},
		{[]string{"pool", "create", "big", "--image", "busybox", "--size", "0"}, "pool size"},
		{[]string{"pool", "create", "big", "--image", "busybox", "--size", "1", "--memory", "1k"}, "memory"},
		{[]string{"pool", "create", "big", "--image", "nosuch", "--size", "1"}, "nosuch"},
	} {
		r := e.run(nil, tc.args...)
		assertOneLineError(t, r, tc.want)
	}
	var all []poolInfo
	json.Unmarshal([]byte(e.ok("pool", "ls", "--format", "json")), &all) //nolint:errcheck // checked below
	if len(all) != 1 {
		t.Errorf("pools after refused creates: %+v", all)
	}
}

// hutch serve's creates take pooled sandboxes too.
func TestPoolServe(t *testing.T) {
	s := newServer(t, "")
	s.removePools()
	s.ok("pool", "create", "warm", "--image", "busybox", "--size", "1", "--wait")
	p := s.waitPoolFull("warm")
	key := s.tenantAdd("acme")
	s.serve()
	sb := s.createSandbox(key, "busybox")
	if !slices.Contains(p.Members, sb.SandboxID) {
		t.Fatalf("serve created %s, not the pool's %v\nserver log:\n%s", sb.SandboxID, p.Members, s.logTail(20))
	}
	s.waitPoolFull("warm")
	s.ok("pool", "rm", "warm")
	if r := s.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-KEY": key}); r.status != 204 {
		t.Fatalf("DELETE: %s", r)
	}
	s.stopAndCheckClean()
}

// A pool of linked sandboxes (deny-all allow) serves creates of allow and
// open: the claimed sandbox has the request's policy, proven by traffic.
func TestPoolNetworkPolicy(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	w := newTestWorld(t)
	e.ok("pool", "create", "net", "--image", "busybox", "--size", "1", "--net", "allow", "--wait")
	p := e.waitPoolFull("net")

	id := e.create("--net", "allow", "--allow", w.testHost+":8080")
	if !slices.Contains(p.Members, id) {
		t.Fatalf("create --net allow made %s, not the pool's %v", id, p.Members)
	}
	mustReach(t, e, id, w.testHost, "8080")
	mustNotReach(t, e, id, w.testHost, "80")
	mustNotReach(t, e, id, w.public, "80")

	p = e.waitPoolFull("net")
	open := e.create("--net", "open")
	if !slices.Contains(p.Members, open) {
		t.Fatalf("create --net open made %s, not the pool's %v", open, p.Members)
	}
	mustReach(t, e, open, w.public, "80")
	mustNotReach(t, e, open, w.metadata, "80")
	mustNotReach(t, e, open, w.testHost, "8080")

	// A pool with a link cannot serve --net none: a fresh sandbox.
	p = e.waitPoolFull("net")
	none := e.create("--net", "none")
	if slices.Contains(p.Members, none) {
		t.Fatalf("create --net none took pooled sandbox %s", none)
	}
	e.ok("pool", "rm", "net")
	e.ok("rm", "-f", id, open, none)
	for _, s := range append(p.Members, id, open, none) {
		e.assertClean(s)
	}
}

// hutch run --rm returns with its command's status once the sandbox has
// gone from every view (ls, inspect, its name), before its teardown ends;
// that finishes in a detached hutch, and leaves nothing. A removal whose
// remover died (or whose host did) is finished by the next ls. A sandbox
// that published a host port has freed it when run returns.
func TestRunRmTeardown(t *testing.T) {
	e := newEnv(t)
	e.removePools()
	e.ok("pool", "create", "warm", "--image", "busybox", "--size", "1", "--wait")
	p := e.waitPoolFull("warm")
	r := e.run(nil, "run", "--rm", "--image", "busybox", "--", "sh", "-c", "echo out; exit 7")
	if r.code != 7 || r.stdout != "out\n" {
		t.Fatalf("run --rm from the pool: want out and exit 7, got %s", r)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("listed after run --rm: %+v", all)
	}
	if r := e.run(nil, "inspect", p.Members[0]); r.code == 0 {
		t.Fatalf("inspect of the removed sandbox: %s", r)
	}
	e.assertClean(p.Members[0])

	// A name is free again when run returns.
	for i := range 2 {
		if out := e.ok("run", "--rm", "--name", "job", "--image", "busybox", "--", "echo", "again"); out != "again\n" {
			t.Fatalf("run %d --name job: %q", i, out)
		}
	}

	// The remover died (or the host did) after the record was set aside:
	// the sandbox's processes, cgroup and network are still there.
	id := strings.TrimSpace(e.ok("create", "--image", "busybox", "--net", "open"))
	dir := filepath.Join(e.root, "sandboxes", id)
	if err := os.Rename(filepath.Join(dir, "sandbox.json"), filepath.Join(dir, "removing.json")); err != nil {
		t.Fatal(err)
	}
	if all := e.list(); len(all) != 0 {
		t.Fatalf("listed while being removed: %+v", all)
	}
	if left := e.leftovers(id); len(left) > 0 {
		t.Fatalf("ls did not finish the removal:\n%s", strings.Join(left, "\n"))
	}

	// A published port is free once run returns.
	port := freePort(t)
	for i := range 2 {
		e.ok("run", "--rm", "--image", "busybox", "-p", fmt.Sprintf("127.0.0.1:%d:8080", port), "--", "true")
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("run %d: port %d after run --rm returned: %v", i, port, err)
		}
		l.Close()
	}
}
