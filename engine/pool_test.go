package engine

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/policy"
)

func TestPoolMatches(t *testing.T) {
	def := &poolDef{Image: "busybox:latest", CPUs: 2, Memory: 256 << 20, Pids: 1024, Disk: 10 << 30, Network: policy.NetAllow}
	pr := policy.Request{CPUs: 2, Memory: 256 << 20, Pids: 1024, Disk: 10 << 30, Network: policy.NetOpen}
	for _, tc := range []struct {
		name  string
		image string
		req   CreateRequest
		edit  func(*policy.Request)
		want  bool
	}{
		{"same class, other linked mode", "busybox:latest", CreateRequest{}, nil, true},
		{"other image", "other:latest", CreateRequest{}, nil, false},
		{"other memory", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.Memory = 512 << 20 }, false},
		{"other cpus", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.CPUs = 1 }, false},
		{"other pids", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.Pids = 100 }, false},
		{"other disk", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.Disk = 1 << 30 }, false},
		{"none from a linked pool", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.Network = policy.NetNone }, false},
		{"other dns", "busybox:latest", CreateRequest{DNS: []string{"10.0.0.1"}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pr
			if tc.edit != nil {
				tc.edit(&p)
			}
			if got := def.matches(tc.image, tc.req, p); got != tc.want {
				t.Errorf("matches = %v, want %v", got, tc.want)
			}
		})
	}
	for _, req := range []CreateRequest{
		{Ports: []PortMapping{{}}}, {Mounts: []Mount{{}}}, {Setup: []string{"true"}},
		{CACerts: []CACert{{}}}, {Pull: PullAlways},
	} {
		if claimable(req) {
			t.Errorf("claimable(%+v) = true, want false", req)
		}
	}
}

// BenchmarkClaim measures a claim's own work, in process: the lookup of
// the pool and its image, the rename, the record. Its members are records
// naming this process as their running sandbox, so that no sandbox
// boots; the pool has no fillers.lock, so that no filler starts. Needs
// HUTCH_BIN (the image archive and a runsc to name).
func BenchmarkClaim(b *testing.B) {
	bin := os.Getenv("HUTCH_BIN")
	if bin == "" {
		b.Skip("needs HUTCH_BIN, the built bin/ directory")
	}
	e, err := Open(Options{
		Root:                b.TempDir(),
		RunscPath:           filepath.Join(bin, "runsc"),
		DefaultImageArchive: filepath.Join(bin, "images", "busybox.tar"),
		HutchPath:           filepath.Join(bin, "hutch"),
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	img, err := e.Image(ctx, TestImage)
	if err != nil {
		b.Fatal(err)
	}
	def := &poolDef{Gen: "g", Name: "bench", Size: 1, Image: img.Name}
	pr, err := e.validate(def.request())
	if err != nil {
		b.Fatal(err)
	}
	def.CPUs, def.Memory, def.Pids, def.Disk, def.Network = pr.CPUs, pr.Memory, pr.Pids, pr.Disk, pr.Network
	if err := os.MkdirAll(e.membersDir(def.Name), 0o700); err != nil {
		b.Fatal(err)
	}
	if err := writeJSON(filepath.Join(e.poolDir(def.Name), "pool.json"), def); err != nil {
		b.Fatal(err)
	}
	start, err := assembly.ProcessStart(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		id, _ := newID()
		rec := &record{
			ID: id, Image: img.Name, ImageDigest: img.Digest, CPUs: pr.CPUs, Memory: pr.Memory, Pids: pr.Pids,
			Disk: pr.Disk, Network: pr.Network, Env: pr.Env, Pid: os.Getpid(), PidStart: start, BootID: bootID(),
		}
		if err := os.Mkdir(e.sandboxDir(id), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := writeJSON(e.pooledPath(id), rec); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.membersDir(def.Name), id), nil, 0o600); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		sb, err := e.Claim(ctx, CreateRequest{Image: "busybox"})
		if err != nil || sb == nil || sb.ID != id {
			b.Fatalf("claim: %v, %v; want %s", sb, err, id)
		}
	}
}

// A claim's refill starts only when the claimer lets it (StartPoolFills),
// holding the pool's fillers.lock shared from the claim on, so that pool
// rm waits for it; the filler inherits the lock.
func TestDeferredFill(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "started")
	fake := filepath.Join(dir, "hutch")
	// The filler: it records its arguments and whether its descriptor 3
	// is the pool's fillers.lock.
	script := "#!/bin/sh\nls -l /proc/self/fd/3 > " + mark + ".fd\necho \"$@\" > " + mark + ".tmp && mv " + mark + ".tmp " + mark + "\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &Engine{opts: Options{Root: filepath.Join(dir, "root"), RunscPath: "/runsc", HutchPath: fake}}
	if err := os.MkdirAll(e.poolDir("p"), 0o700); err != nil {
		t.Fatal(err)
	}
	lockPath := filepath.Join(e.poolDir("p"), "fillers.lock")
	if err := os.WriteFile(lockPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	DeferPoolFills()
	t.Cleanup(func() { deferFills.Store(false) })

	e.kickFill("p", time.Minute)
	e.kickFill("p", time.Minute) // one filler for both claims
	time.Sleep(50 * time.Millisecond)
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the filler started before StartPoolFills")
	}
	unlock, ok, err := tryLockFile(lockPath)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		unlock()
		t.Fatal("fillers.lock is free while a refill waits to start: pool rm would not wait for it")
	}
	StartPoolFills()
	// The shell waits out the delay: the filler itself has not started.
	time.Sleep(50 * time.Millisecond)
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the filler started at once, not after its delay")
	}
	if _, ok, _ := tryLockFile(lockPath); ok {
		t.Fatal("fillers.lock is free while the filler waits out its delay")
	}
	ps, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	killed := false
	for _, p := range ps {
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), fake) && strings.HasPrefix(string(b), "/bin/sh\x00") {
			// Cut the delay short: what the filler is handed is the point.
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			for _, c := range children(pid) {
				syscall.Kill(c, syscall.SIGTERM) //nolint:errcheck
			}
			killed = true
		}
	}
	if !killed {
		t.Fatal("no shell waits out the filler's delay")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(mark); err == nil {
			args := strings.Fields(string(b))
			want := []string{"--root", e.opts.Root, "--runsc", "/runsc", PoolFillCommand, "--lock-fd", "3", "--delay", "0s", "p"}
			if !slices.Equal(args, want) {
				t.Errorf("filler args %q, want %q", args, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the filler did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fd, _ := os.ReadFile(mark + ".fd")
	if !strings.Contains(string(fd), lockPath) {
		t.Errorf("the filler's descriptor 3 is %q, want %s", fd, lockPath)
	}
}

// children are the PIDs whose parent is pid.
func children(pid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(s)))
			out = append(out, c)
		}
	}
	return out
}
