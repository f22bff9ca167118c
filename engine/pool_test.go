package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"hutch.dev/hutch/assembly"
	"hutch.dev/hutch/engine/pool"
	"hutch.dev/hutch/policy"
)

func TestPoolMatches(t *testing.T) {
	def := &pool.Def{Image: "busybox:latest", CPUs: 2, Memory: 256 << 20, Pids: 1024, Disk: 10 << 30, Network: policy.NetAllow}
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
		{"a Docker sandbox from a pool of others", "busybox:latest", CreateRequest{}, func(r *policy.Request) { r.Docker = true }, false},
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
			if got := poolMatches(def, tc.image, tc.req, p); got != tc.want {
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
	def := &pool.Def{Gen: "g", Name: "bench", Size: 1, Image: img.Name}
	pr, err := e.validate(poolRequest(def))
	if err != nil {
		b.Fatal(err)
	}
	def.CPUs, def.Memory, def.Pids, def.Disk, def.Network = pr.CPUs, pr.Memory, pr.Pids, pr.Disk, pr.Network
	if err := e.pools().Create(def); err != nil {
		b.Fatal(err)
	}
	// No fillers.lock: no filler starts.
	if err := os.Remove(filepath.Join(e.pools().Dir(def.Name), "fillers.lock")); err != nil {
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
		if err := e.pools().AddMember(def.Name, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		sb, err := e.Claim(ctx, CreateRequest{Image: "busybox"})
		if err != nil || sb == nil || sb.ID != id {
			b.Fatalf("claim: %v, %v; want %s", sb, err, id)
		}
	}
}
