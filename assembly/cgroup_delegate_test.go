package assembly

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/policy"
)

// fakeCgroupfs lays out a unified hierarchy in a temporary directory as
// systemd leaves it for a logged-in user: user.slice and user-UID.slice
// are root's, user@UID.service and what is below it the user's. The
// caller's uid stands for the user; other is a uid that is not the
// user's. Control files are plain files.
func fakeCgroupfs(t *testing.T, other int, controllers string) (mount string) {
	t.Helper()
	mount = t.TempDir()
	uid := os.Geteuid()
	mk := func(p string, owner int, ctrls string) {
		dir := filepath.Join(mount, p)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range map[string]string{"cgroup.controllers": ctrls, "cgroup.subtree_control": "", "cgroup.procs": ""} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(filepath.Join(dir, f), owner, owner); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(dir, owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	all := "cpuset cpu io memory pids"
	mk("user.slice", other, all)
	mk("user.slice/user-1000.slice", other, all)
	mk("user.slice/user-1000.slice/session-3.scope", other, all)
	mk("user.slice/user-1000.slice/user@1000.service", uid, controllers)
	mk("user.slice/user-1000.slice/user@1000.service/app.slice", uid, controllers)
	mk("user.slice/user-1000.slice/user@1000.service/app.slice/run-1.scope", uid, controllers)
	return mount
}

func requiresRootForChown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("laying out a fake cgroupfs with other owners needs root")
	}
}

// Not run on a real cgroup v2 host here (this one is hybrid): the
// delegation path is checked against a fake cgroupfs.
func TestFindDelegation(t *testing.T) {
	requiresRootForChown(t)
	mount := fakeCgroupfs(t, 4242, "cpu memory pids")
	uid := os.Geteuid()
	const service = "/user.slice/user-1000.slice/user@1000.service"

	d, err := FindDelegation(mount, []byte("0::"+service+"/app.slice/run-1.scope\n"), uid)
	if err != nil {
		t.Fatal(err)
	}
	if d.Path != service || d.Mount != mount || strings.Join(d.Controllers, ",") != "cpu,memory,pids" {
		t.Fatalf("delegation = %+v, want %s with cpu,memory,pids", d, service)
	}
	// A login session's scope is root's: nothing is delegated there.
	if _, err := FindDelegation(mount, []byte("0::/user.slice/user-1000.slice/session-3.scope\n"), uid); !errdefs.IsNotFound(err) {
		t.Fatalf("session scope: %v", err)
	}
	// A v1-only process line names no v2 cgroup.
	if _, err := FindDelegation(mount, []byte("4:memory:/user.slice\n"), uid); !errdefs.IsNotFound(err) {
		t.Fatalf("v1 only: %v", err)
	}
	// Another user finds nothing in this user's subtree.
	if _, err := FindDelegation(mount, []byte("0::"+service+"/app.slice/run-1.scope\n"), 4343); !errdefs.IsNotFound(err) {
		t.Fatalf("another uid: %v", err)
	}
	// A subtree without the memory controller says so.
	mount2 := fakeCgroupfs(t, 4242, "cpu pids")
	d2, err := FindDelegation(mount2, []byte("0::"+service+"/app.slice/run-1.scope\n"), uid)
	if err != nil {
		t.Fatal(err)
	}
	if d2.Has("memory") || !d2.Has("cpu") || !d2.Has("pids") {
		t.Fatalf("controllers %v: want cpu and pids, no memory", d2.Controllers)
	}
}

func TestCreateDelegated(t *testing.T) {
	requiresRootForChown(t)
	mount := fakeCgroupfs(t, 4242, "cpu memory pids")
	d := Delegation{Mount: mount, Path: "/user.slice/user-1000.slice/user@1000.service", Controllers: []string{"cpu", "memory", "pids"}}
	path := d.SandboxPath("abc")
	if path != d.Path+"/hutch/abc" {
		t.Fatalf("sandbox path %s", path)
	}
	res := policy.HostResources(policy.Request{CPUs: 1.5, Memory: 256 << 20, Pids: 100})
	ctrls, err := CreateDelegated(mount, path, res)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ctrls, ",") != "cpu,memory,pids" {
		t.Fatalf("controllers set: %v", ctrls)
	}
	for _, p := range []string{d.Path, filepath.Join(d.Path, "hutch")} {
		got, _ := os.ReadFile(filepath.Join(mount, p, "cgroup.subtree_control"))
		if string(got) != "+cpu +memory +pids" {
			t.Fatalf("%s/cgroup.subtree_control = %q, want +cpu +memory +pids", p, got)
		}
	}
	for f, want := range map[string]string{"cpu.max": "150000 100000", "memory.max": "268435456", "pids.max": "556"} {
		got, _ := os.ReadFile(filepath.Join(mount, path, f))
		if string(got) != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	if _, err := CreateDelegated(mount, path, res); err == nil {
		t.Fatal("creating a sandbox cgroup that exists succeeded")
	}
	if err := RemoveDelegated(mount, path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mount, path)); !os.IsNotExist(err) {
		t.Fatalf("cgroup left after RemoveDelegated: %v", err)
	}
	if err := RemoveDelegated(mount, path); err != nil {
		t.Fatalf("removing a removed cgroup: %v", err)
	}

	// A subtree without memory gets the other limits only.
	mount2 := fakeCgroupfs(t, 4242, "cpu pids")
	ctrls, err = CreateDelegated(mount2, path, res)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ctrls, ",") != "cpu,pids" {
		t.Fatalf("controllers set without memory: %v", ctrls)
	}
	if _, err := os.Stat(filepath.Join(mount2, path, "memory.max")); !os.IsNotExist(err) {
		t.Fatalf("memory.max written without the memory controller: %v", err)
	}
}

func TestDelegatedLimits(t *testing.T) {
	res := policy.HostResources(policy.Request{CPUs: 1.5, Memory: 256 << 20, Pids: 100})
	got := delegatedLimits(res, []string{"cpu", "memory", "pids"})
	want := map[string]string{
		"cpu.max":         "150000 100000",
		"memory.max":      "268435456",
		"memory.swap.max": "0",
		"pids.max":        "556",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// Only the delegated controllers' limits are written.
	only := delegatedLimits(res, []string{"pids"})
	keys := make([]string, 0, len(only))
	for k := range only {
		keys = append(keys, k)
	}
	if !slices.Equal(keys, []string{"pids.max"}) {
		t.Fatalf("with pids only: %v", only)
	}
	if len(delegatedLimits(nil, LimitControllers)) != 0 {
		t.Fatal("limits from no resources")
	}
	if len(delegatedLimits(&specs.LinuxResources{}, LimitControllers)) != 0 {
		t.Fatal("limits from empty resources")
	}
}
