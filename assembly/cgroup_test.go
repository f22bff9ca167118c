package assembly

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"hutch.dev/hutch/policy"
)

// The cgroup v2 path cannot run against a kernel on this project's v1
// hosts. It is run here against a directory laid out like a v2 hierarchy:
// what a v2 host would get written into its cgroup files.
func TestCreateCgroup2(t *testing.T) {
	r, err := policy.Validate(policy.Request{CPUs: 0.5, Memory: 256 << 20, Pids: 100})
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	for _, d := range []string{mnt, filepath.Join(mnt, "hutch")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := createCgroup2(mnt, "/hutch/abc", policy.HostResources(r)); err != nil {
		t.Fatal(err)
	}
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(mnt, rel))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for f, want := range map[string]string{
		"hutch/abc/cpu.max": "50000 100000", "hutch/abc/memory.max": "268435456",
		"hutch/abc/pids.max": "556",
	} {
		if got := read(f); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	for _, f := range []string{"cgroup.subtree_control", "hutch/cgroup.subtree_control"} {
		got := read(f)
		for _, c := range []string{"+cpu", "+memory", "+pids"} {
			if !strings.Contains(got, c) {
				t.Errorf("%s = %q: controller %s not enabled for the sandbox", f, got, c)
			}
		}
	}
}

// The cgroup a process runs in is found and read like a sandbox's: the
// test's own, with the counters a host shows for it; a cgroup that does
// not exist is ErrNoCgroup.
func TestProcessCgroup(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		t.Skip("no cgroup filesystem")
	}
	path, err := ProcessCgroup(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(path, "/") {
		t.Fatalf("cgroup path %q is not a cgroupfs path", path)
	}
	st, err := ReadCgroup(path)
	if err != nil {
		t.Fatalf("read own cgroup %s: %v", path, err)
	}
	if st.MemoryUsage == 0 {
		t.Fatalf("own cgroup %s shows no memory in use: %+v", path, st)
	}
	if _, err := ReadCgroup("/hutch-no-such-cgroup/x"); !errors.Is(err, ErrNoCgroup) {
		t.Fatalf("missing cgroup: %v, want ErrNoCgroup", err)
	}
}
