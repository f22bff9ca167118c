package assembly

import (
	"os"
	"path/filepath"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestClampCPU(t *testing.T) {
	q := func(v int64) *int64 { return &v }
	p := func(v uint64) *uint64 { return &v }
	for _, c := range []struct {
		name       string
		cpu        *specs.LinuxCPU
		pq         int64
		pp         uint64
		wantQ      int64
		wantPeriod uint64
	}{
		{"above the parent", &specs.LinuxCPU{Quota: q(200000), Period: p(100000)}, 25000, 100000, 25000, 100000},
		{"below the parent", &specs.LinuxCPU{Quota: q(10000), Period: p(100000)}, 25000, 100000, 10000, 100000},
		{"unset under a limited parent", nil, 50000, 100000, 50000, 100000},
		{"parent unlimited", &specs.LinuxCPU{Quota: q(200000), Period: p(100000)}, 0, 100000, 200000, 100000},
		{"other periods", &specs.LinuxCPU{Quota: q(100000), Period: p(50000)}, 150000, 100000, 150000, 100000},
	} {
		res := &specs.LinuxResources{CPU: c.cpu}
		ClampCPU(res, c.pq, c.pp)
		if res.CPU == nil || res.CPU.Quota == nil || *res.CPU.Quota != c.wantQ || *res.CPU.Period != c.wantPeriod {
			t.Errorf("%s: got %+v, want quota %d period %d", c.name, res.CPU, c.wantQ, c.wantPeriod)
		}
	}
}

func TestReadCPUQuota(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "pod1"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "pod1", "cpu.cfs_quota_us"), []byte("25000\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "pod1", "cpu.cfs_period_us"), []byte("100000\n"), 0o644))
	if qv, pv, err := cfsQuota(dir, "pod1"); err != nil || qv != 25000 || pv != 100000 {
		t.Fatalf("v1: %d %d %v", qv, pv, err)
	}
	must(os.WriteFile(filepath.Join(dir, "pod1", "cpu.cfs_quota_us"), []byte("-1\n"), 0o644))
	if qv, _, err := cfsQuota(dir, "pod1"); err != nil || qv != 0 {
		t.Fatalf("v1 unlimited: %d %v", qv, err)
	}
	must(os.WriteFile(filepath.Join(dir, "pod1", "cpu.max"), []byte("max 100000\n"), 0o644))
	if qv, pv, err := cpuMax(dir, "pod1"); err != nil || qv != 0 || pv != 100000 {
		t.Fatalf("v2 unlimited: %d %d %v", qv, pv, err)
	}
	must(os.WriteFile(filepath.Join(dir, "pod1", "cpu.max"), []byte("30000 100000\n"), 0o644))
	if qv, pv, err := cpuMax(dir, "pod1"); err != nil || qv != 30000 || pv != 100000 {
		t.Fatalf("v2: %d %d %v", qv, pv, err)
	}
}
