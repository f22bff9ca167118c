package engine

import (
	"testing"

	"sbx.dev/sbx/policy"
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
