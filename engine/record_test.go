package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// hostFields are the record's fields that name host processes and host
// paths: the debug record shows them, the API view never does.
var hostFields = []string{
	"Pid", "PidStart", "BootID", "CreatorPid", "ResolverPid", "ResolverStart",
	"Rootfs", "Forwarder", "WatchdogPid", "WatchdogStart",
}

// fullRecord is a record with every field set, host values recognisable.
func fullRecord(t *testing.T) *record {
	t.Helper()
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &record{
		ID: "0123456789abcdef0123456789abcdef", Name: "web", Image: "busybox:latest",
		ImageDigest: digest.FromString("image"), Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		State: StateStopped, CPUs: 1.5, Memory: 512 << 20, Pids: 256, Disk: 1 << 30,
		Network: "allow", Allow: []string{"10.1.2.3"}, DNS: []string{"10.0.0.53"}, Linked: true,
		IP: "10.200.0.2", Env: []string{"A=1"}, Workdir: "/work", Labels: map[string]string{"k": "v"},
		Rootfs:   "/var/lib/hutch-host-only/rootfs",
		ImageEnv: []string{"PATH=/bin"}, ImageWorkdir: "/", ImageUser: "1000",
		Pid: 987651, PidStart: 987652, BootID: "boot-id-host-only", CreatorPid: 987653,
		Stopped: true, ResolverPid: 987654, ResolverStart: 987655,
		Mounts:  []Mount{{Source: "/srv/data", Target: "/data", ReadOnly: true}, {Volume: "cache", Target: "/cache"}},
		Secrets: []string{"TOKEN"}, CACerts: []string{"CN=Test CA sha256:00"}, OOMKilled: true, OneShot: true,
		Ports:     []PortMapping{{HostIP: "127.0.0.1", HostPort: 8080, Port: 80}},
		Forwarder: &ForwarderRef{Pid: 987656},
	}
	r.Paused, r.Checkpoint, r.ForkedFrom = false, digest.FromString("ck"), "fedcba9876543210fedcba9876543210"
	r.Setup, r.SetupCache, r.SetupImage = []string{"true"}, "ran", "setup/x"
	r.Timeout, r.OnTimeout, r.Deadline = "1h", "pause", &deadline
	r.WatchdogPid, r.WatchdogStart = 987657, 987658
	for _, f := range hostFields {
		if reflect.ValueOf(r).Elem().FieldByName(f).IsZero() {
			t.Fatalf("fullRecord leaves host field %s unset", f)
		}
	}
	return r
}

func TestRecordRoundTrips(t *testing.T) {
	e := &Engine{opts: Options{Root: t.TempDir()}}
	want := fullRecord(t)
	if err := os.MkdirAll(e.sandboxDir(want.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.save(want); err != nil {
		t.Fatal(err)
	}
	got, err := e.load(want.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("record changed on disk:\ngot  %s\nwant %s", g, w)
	}
	fi, err := os.Stat(e.recordPath(want.ID))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record file mode: %v %v, want 0600", fi.Mode(), err)
	}
}

// TestViewHidesHost marshals the API view of a record with every field
// set: no host PID, start time, boot ID or engine path appears in it,
// under any key, and nothing else is lost.
func TestViewHidesHost(t *testing.T) {
	r := fullRecord(t)
	b, err := json.Marshal(r.view())
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	// A host number as a JSON number, or a host string anywhere.
	hostValue := regexp.MustCompile(`[:\[,]98765[1-8][,}\]]|boot-id-host-only|hutch-host-only`)
	if v := hostValue.FindString(out); v != "" {
		t.Errorf("the view shows host value %s: %s", v, out)
	}
	if full, _ := json.Marshal(r); len(hostValue.FindAllString(string(full), -1)) < len(hostFields) {
		t.Fatalf("the check misses host values in the record itself: %s", full)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	collectKeys(m, &keys)
	for _, k := range keys {
		lk := strings.ToLower(k)
		if strings.HasSuffix(lk, "pid") || strings.Contains(lk, "start") ||
			strings.Contains(lk, "rootfs") || strings.Contains(lk, "boot") || strings.Contains(lk, "forwarder") || strings.Contains(lk, "watchdog") {
			t.Errorf("the view has host key %q", k)
		}
	}
	// What a user needs is there: limits, the mounts, the CA subjects.
	for _, k := range []string{"id", "state", "memory", "pids", "mounts", "caCerts", "secrets", "ports", "deadline", "checkpoint"} {
		if _, ok := m[k]; !ok {
			t.Errorf("the view lacks %q: %s", k, out)
		}
	}
	var back Sandbox
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Mounts, r.Mounts) || back.Memory != r.Memory || back.State != r.State {
		t.Errorf("view round trip: got %+v", back)
	}
	// The view is a copy: changing it leaves the record alone.
	v := r.view()
	v.Labels["k"], v.Mounts[0].Target = "changed", "/elsewhere"
	if r.Labels["k"] != "v" || r.Mounts[0].Target != "/data" {
		t.Errorf("changing the view changed the record")
	}
	if (*record)(nil).view() != nil {
		t.Errorf("a nil record has a non-nil view")
	}
}

func collectKeys(v any, keys *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			*keys = append(*keys, k)
			collectKeys(x, keys)
		}
	case []any:
		for _, x := range v {
			collectKeys(x, keys)
		}
	}
}

// oldRecord is a sandbox.json as engines before the API view wrote it (no
// mounts field).
const oldRecord = `{
  "id": "aaaaaaaaaaaabbbbbbbbbbbbcccccccc",
  "name": "old",
  "image": "busybox:latest",
  "imageDigest": "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
  "created": "2026-03-01T10:00:00.123456789Z",
  "state": "running",
  "cpus": 1,
  "memory": 536870912,
  "pids": 1024,
  "disk": 10737418240,
  "network": "open",
  "dns": ["10.0.0.53"],
  "linked": true,
  "ip": "10.200.0.6",
  "env": ["A=1"],
  "workdir": "/root",
  "labels": {"dev.hutch.serve.tenant": "t1"},
  "rootless": false,
  "rootfs": "/var/lib/hutch/overlay/rootfs/aaaa",
  "imageEnv": ["PATH=/usr/bin:/bin"],
  "imageWorkdir": "/",
  "pid": 4242,
  "pidStart": 12345,
  "bootID": "0f0f0f0f-0000-0000-0000-000000000000",
  "stopped": true,
  "resolverPid": 4343,
  "resolverStart": 12346,
  "secrets": ["TOKEN"],
  "caCerts": ["CN=Corp CA sha256:ab"],
  "ports": [{"hostIP": "127.0.0.1", "hostPort": 8080, "port": 80}],
  "forwarder": {"pid": 4444, "start": 12347},
  "timeout": "1h0m0s",
  "onTimeout": "pause",
  "deadline": "2026-03-01T11:00:00Z",
  "watchdogPid": 4545,
  "watchdogStart": 12348
}`

func TestOldRecordLoads(t *testing.T) {
	e := &Engine{opts: Options{Root: t.TempDir()}}
	const id = "aaaaaaaaaaaabbbbbbbbbbbbcccccccc"
	if err := os.MkdirAll(e.sandboxDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.sandboxDir(id), "sandbox.json"), []byte(oldRecord), 0o600); err != nil {
		t.Fatal(err)
	}
	sb, err := e.Get(context.Background(), "old")
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != id || sb.State != StateStopped || sb.Memory != 512<<20 || sb.Network != "open" ||
		len(sb.Ports) != 1 || sb.Ports[0].HostPort != 8080 || sb.Deadline == nil || sb.Mounts != nil ||
		sb.Labels["dev.hutch.serve.tenant"] != "t1" || len(sb.CACerts) != 1 {
		t.Fatalf("old record: %+v", sb)
	}
	rec, err := e.load(id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Pid != 4242 || rec.ResolverPid != 4343 || rec.Forwarder == nil || rec.Forwarder.Pid != 4444 ||
		rec.Rootfs != "/var/lib/hutch/overlay/rootfs/aaaa" || rec.WatchdogPid != 4545 || !rec.Linked {
		t.Fatalf("old record's host fields: %+v", rec)
	}
	raw, err := e.Record(context.Background(), "aaaaaaaaaaaa")
	if err != nil || !strings.Contains(string(raw), `"pid": 4242`) || !strings.Contains(string(raw), `"rootfs": "/var/lib/hutch/overlay/rootfs/aaaa"`) {
		t.Fatalf("debug record: %s %v", raw, err)
	}
}

// TestAbandoned: a sandbox whose creating process is gone is abandoned;
// one this process is still making is not, and is this process's.
func TestAbandoned(t *testing.T) {
	mine := &record{ID: "a", State: StateCreating, CreatorPid: os.Getpid()}
	if v := mine.view(); v.Abandoned() || !v.CreatingHere() {
		t.Errorf("a create in this process: abandoned %v, here %v", v.Abandoned(), v.CreatingHere())
	}
	gone := &record{ID: "b", State: StateRunning, CreatorPid: 1 << 22}
	if v := gone.view(); !v.Abandoned() || v.CreatingHere() {
		t.Errorf("a create whose process is gone: abandoned %v, here %v", v.Abandoned(), v.CreatingHere())
	}
	made := &record{ID: "c", State: StateRunning}
	if v := made.view(); v.Abandoned() || v.CreatingHere() {
		t.Errorf("a finished sandbox: abandoned %v, here %v", v.Abandoned(), v.CreatingHere())
	}
}
