package integration

import (
	"encoding/json"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests run hostile workloads in real sandboxes and check what a
// neighbour on the same host cares about. Their bounds are functional
// (does the neighbour still answer, is the limit the limit), measured
// against a baseline taken in the same run, not speed targets.

// execLatency is the median time of `hutch exec ID -- true` over n runs.
func (e *env) execLatency(id string, n int) time.Duration {
	e.t.Helper()
	var d []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		e.ok("exec", id, "--", "true")
		d = append(d, time.Since(t0))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// hostLatency is the median time to run /bin/true on the host.
func hostLatency(t *testing.T, n int) time.Duration {
	var d []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

// neighbourBound is how much slower a neighbour may answer under a hostile
// sandbox: ten times its own baseline, and never less than 5 s.
func neighbourBound(before time.Duration) time.Duration {
	return max(10*before, 5*time.Second)
}

func TestForkBombStopsAtPidsLimit(t *testing.T) {
	e := newEnv(t)
	neighbour := e.create()
	bomb := e.create("--pids", "64", "--cpus", "1")
	before, hostBefore := e.execLatency(neighbour, 5), hostLatency(t, 5)

	// Forks until the limit, then keeps trying: sustained pressure.
	e.ok("exec", "-d", bomb, "--", "sh", "-c", "while :; do sleep 1000 & done 2>/dev/null")
	var s statsRecord
	waitFor(t, func() bool { s = e.stats(bomb); return s.Pids.Current >= 56 })

	during, hostDuring := e.execLatency(neighbour, 5), hostLatency(t, 5)
	t.Logf("neighbour exec: %v before, %v during; host: %v before, %v during", before, during, hostBefore, hostDuring)
	if during > neighbourBound(before) {
		t.Errorf("neighbour sandbox exec took %v under a fork bomb, %v before", during, before)
	}
	if hostDuring > neighbourBound(hostBefore) {
		t.Errorf("host process start took %v under a fork bomb, %v before", hostDuring, hostBefore)
	}
	for i := 0; i < 5; i++ {
		s = e.stats(bomb) // fails unless the bomb's sandbox still runs
		if s.Pids.Current > 64 {
			t.Fatalf("%d processes in a sandbox limited to 64", s.Pids.Current)
		}
		if s.Pids.HostTasks > s.Pids.HostLimit {
			t.Fatalf("host tasks %d over the host limit %d", s.Pids.HostTasks, s.Pids.HostLimit)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.ok("rm", "-f", bomb)
	e.assertClean(bomb)
	e.ok("exec", neighbour, "--", "true")
}

func TestMemoryBombIsOOMKilledAlone(t *testing.T) {
	e := newEnv(t)
	neighbour := e.create()
	bomb := e.create("--memory", "128m")
	e.ok("exec", neighbour, "--", "sh", "-c", "echo alive > /state")

	r := e.run(nil, "exec", bomb, "--", "sh", "-c", "head -c 1000m /dev/zero | tail > /dev/null; echo survived")
	if r.code != 137 || !strings.Contains(r.stderr, "out of memory") || !strings.Contains(r.stderr, "128MiB") || strings.Contains(r.stdout, "survived") {
		t.Fatalf("memory bomb: want exit 137 with the reason, got %s", r)
	}
	var rec struct {
		State     string `json:"state"`
		OOMKilled bool   `json:"oomKilled"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", bomb)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.State != "stopped" || !rec.OOMKilled {
		t.Fatalf("inspect after OOM: %+v", rec)
	}
	assertOneLineError(t, e.run(nil, "exec", bomb, "--", "true"), "out of memory")
	if got := e.ok("exec", neighbour, "--", "cat", "/state"); got != "alive\n" {
		t.Fatalf("neighbour lost its state: %q", got)
	}
	e.ok("stop", bomb)
	if err := json.Unmarshal([]byte(e.ok("inspect", bomb)), &rec); err != nil || !rec.OOMKilled {
		t.Fatalf("stop forgot the OOM kill: %+v %v", rec, err)
	}
	e.ok("rm", bomb)
	e.assertClean(bomb)
}

func freeBytes(t *testing.T, path string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

func TestDiskFillerHitsENOSPC(t *testing.T) {
	e := newEnv(t)
	const disk = 64 << 20
	id := e.create("--disk", "64m")
	free := freeBytes(t, e.root)
	r := e.run(nil, "exec", id, "--", "dd", "if=/dev/zero", "of=/fill", "bs=1M", "count=1024")
	if r.code == 0 || !strings.Contains(r.stderr, "No space left on device") {
		t.Fatalf("disk filler: want ENOSPC, got %s", r)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(e.ok("exec", id, "--", "stat", "-c", "%s", "/fill")), 10, 64)
	if err != nil || size < disk*7/8 || size > disk {
		t.Fatalf("filler wrote %d bytes (%v), want about %d", size, err, disk)
	}
	s := e.stats(id)
	if s.Disk.Used < disk*7/8 || s.Disk.Used > disk+4<<20 {
		t.Fatalf("stats: disk used %d, want about %d", s.Disk.Used, disk)
	}
	// Other tenants write to this disk too: the slack allows for them,
	// and stays far below the 1 GiB the filler tried to write.
	if drop := free - freeBytes(t, e.root); drop > disk+256<<20 {
		t.Fatalf("host free space dropped by %d bytes, the sandbox may take %d", drop, disk)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}

func TestCPUHogGetsItsQuota(t *testing.T) {
	e := newEnv(t)
	id := e.create("--cpus", "0.5")
	e.ok("exec", "-d", id, "--", "sh", "-c", "while :; do :; done & while :; do :; done")
	time.Sleep(time.Second)
	s0, t0 := e.stats(id), time.Now()
	time.Sleep(4 * time.Second)
	s1, t1 := e.stats(id), time.Now()
	cores := float64(s1.CPU.UsageNs-s0.CPU.UsageNs) / float64(t1.Sub(t0).Nanoseconds())
	t.Logf("CPU hog with --cpus 0.5 used %.2f cores", cores)
	if cores < 0.3 || cores > 0.7 {
		t.Fatalf("CPU hog with --cpus 0.5 used %.2f cores, want about 0.5", cores)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
