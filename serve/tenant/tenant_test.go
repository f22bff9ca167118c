package tenant

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func tempPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "tenants.json")
}

// open is Open with the once-a-second throttle off, so a test sees
// another writer's change at its next call.
func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.checkEvery = 0
	return s
}

func TestStoreAddAuthenticateRemove(t *testing.T) {
	path := tempPath(t)
	s := open(t, path)
	if l, err := s.List(); err != nil || len(l) != 0 {
		t.Fatalf("List of a missing file = %v, %v; want empty", l, err)
	}
	q := Quota{MaxSandboxes: 3, MaxCPUs: 4, MaxMemory: 4 << 30, MaxDisk: 20 << 30}
	keyA, err := s.Add("acme", q)
	if err != nil {
		t.Fatal(err)
	}
	keyB, err := s.Add("beta-2", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	keyRE := regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)
	for _, k := range []string{keyA, keyB} {
		if !keyRE.MatchString(k) {
			t.Errorf("key %q: want e2b_ and 40 hex digits", k)
		}
	}
	if keyA == keyB {
		t.Fatal("two tenants got the same key")
	}

	for _, tc := range []struct {
		key  string
		want string // tenant name, "" = refused
	}{
		{keyA, "acme"},
		{keyB, "beta-2"},
		{"", ""},
		{"e2b_" + strings.Repeat("0", 40), ""},
		{keyA + "x", ""},
		{strings.ToUpper(keyA), ""},
		{hashKey(keyA), ""}, // the stored hash is not a key
	} {
		got, ok := s.Authenticate(tc.key)
		if ok != (tc.want != "") || got.Name != tc.want {
			t.Errorf("Authenticate(%q) = %q, %v; want %q", tc.key, got.Name, ok, tc.want)
		}
	}
	if got, _ := s.Authenticate(keyA); got.Quota != q || got.Created.IsZero() {
		t.Errorf("Authenticate(acme) = %+v; want quota %+v and a creation time", got, q)
	}

	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || l[0].Name != "acme" || l[1].Name != "beta-2" || l[0].Quota != q {
		t.Fatalf("List = %+v", l)
	}

	// A second Store on the file sees the same tenants.
	if got, ok := open(t, path).Authenticate(keyB); !ok || got.Name != "beta-2" {
		t.Errorf("reopened: Authenticate(beta-2's key) = %q, %v", got.Name, ok)
	}

	if err := s.Remove("acme"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Authenticate(keyA); ok {
		t.Error("a removed tenant's key still authenticates")
	}
	if _, ok := s.Authenticate(keyB); !ok {
		t.Error("removing acme lost beta-2")
	}
	if err := s.Remove("acme"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove(acme) twice = %v; want ErrNotFound", err)
	}
}

func TestStoreAddRefuses(t *testing.T) {
	s := open(t, tempPath(t))
	if _, err := s.Add("taken", Quota{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		q    Quota
		want error
	}{
		{"taken", Quota{}, errdefs.ErrAlreadyExists},
		{"", Quota{}, errdefs.ErrInvalidArgument},
		{"Upper", Quota{}, errdefs.ErrInvalidArgument},
		{"-dash", Quota{}, errdefs.ErrInvalidArgument},
		{"_under", Quota{}, errdefs.ErrInvalidArgument},
		{"has space", Quota{}, errdefs.ErrInvalidArgument},
		{"dot.ted", Quota{}, errdefs.ErrInvalidArgument},
		{"../x", Quota{}, errdefs.ErrInvalidArgument},
		{strings.Repeat("a", 64), Quota{}, errdefs.ErrInvalidArgument},
		{"neg-sandboxes", Quota{MaxSandboxes: -1}, errdefs.ErrInvalidArgument},
		{"neg-cpus", Quota{MaxCPUs: -0.5}, errdefs.ErrInvalidArgument},
		{"neg-memory", Quota{MaxMemory: -1}, errdefs.ErrInvalidArgument},
		{"neg-disk", Quota{MaxDisk: -1}, errdefs.ErrInvalidArgument},
	} {
		if _, err := s.Add(tc.name, tc.q); !errors.Is(err, tc.want) {
			t.Errorf("Add(%q, %+v) = %v; want %v", tc.name, tc.q, err, tc.want)
		}
	}
	for _, ok := range []string{"a", "0", "a_b-c", strings.Repeat("a", 63)} {
		if _, err := s.Add(ok, Quota{}); err != nil {
			t.Errorf("Add(%q) = %v", ok, err)
		}
	}
	l, _ := s.List()
	if len(l) != 5 {
		t.Errorf("List after refusals = %d tenants; want 5", len(l))
	}
}

func TestFileHoldsHashNotKey(t *testing.T) {
	path := tempPath(t)
	s := open(t, path)
	key, err := s.Add("acme", Quota{MaxSandboxes: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	random := strings.TrimPrefix(key, KeyPrefix)
	if strings.Contains(string(b), random) || strings.Contains(string(b), random[:20]) {
		t.Fatalf("the tenants file holds the key:\n%s", b)
	}
	if !strings.Contains(string(b), hashKey(key)) {
		t.Fatalf("the tenants file lacks the key's SHA-256:\n%s", b)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tenants file mode %v; want 0600", fi.Mode().Perm())
	}
	// No temporary file is left beside it.
	ents, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range ents {
		if e.Name() != "tenants.json" && e.Name() != "tenants.json.lock" {
			t.Errorf("left beside the tenants file: %s", e.Name())
		}
	}
}

func TestReloadOnChangeByAnotherStore(t *testing.T) {
	path := tempPath(t)
	server := open(t, path)
	admin := open(t, path)
	key, err := admin.Add("acme", Quota{MaxSandboxes: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := server.Authenticate(key); !ok || got.Name != "acme" || got.Quota.MaxSandboxes != 2 {
		t.Fatalf("server: Authenticate after another store's Add = %+v, %v", got, ok)
	}
	if err := admin.Remove("acme"); err != nil {
		t.Fatal(err)
	}
	if _, ok := server.Authenticate(key); ok {
		t.Fatal("server: a key removed by another store still authenticates")
	}

	// A broken rewrite keeps the last good tenants; a fixed one is read.
	key2, err := admin.Add("beta", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := server.Authenticate(key2); !ok {
		t.Fatal("server: beta's key refused")
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"tenants": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := server.Authenticate(key2); !ok {
		t.Fatal("server: a malformed rewrite dropped the last good tenants")
	}
	if _, err := server.List(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("List on a malformed file = %v; want an error naming %s", err, path)
	}
	if _, err := admin.Add("gamma", Quota{}); err == nil {
		t.Error("Add over a malformed file succeeded; it must not overwrite what it cannot read")
	}
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := admin.Remove("beta"); err != nil {
		t.Fatal(err)
	}
	if _, ok := server.Authenticate(key2); ok {
		t.Fatal("server: a key removed after a repaired file still authenticates")
	}
}

func TestReloadThrottled(t *testing.T) {
	path := tempPath(t)
	server, err := Open(path) // the real once-a-second look
	if err != nil {
		t.Fatal(err)
	}
	server.Authenticate("") // looked just now
	key, err := open(t, path).Add("acme", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		if _, ok := server.Authenticate(key); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a running server did not pick up a new tenant within 3s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConcurrentAddLosesNothing(t *testing.T) {
	path := tempPath(t)
	const n = 24
	keys := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			// Each writer its own Store, as separate `hutch tenant add`
			// processes would be.
			s, err := Open(path)
			if err != nil {
				errs <- err
				return
			}
			keys[i], err = s.Add(fmt.Sprintf("t%02d", i), Quota{MaxSandboxes: i})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s := open(t, path)
	l, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != n {
		t.Fatalf("%d tenants in the file after %d concurrent adds", len(l), n)
	}
	for i, k := range keys {
		if got, ok := s.Authenticate(k); !ok || got.Name != fmt.Sprintf("t%02d", i) || got.Quota.MaxSandboxes != i {
			t.Errorf("key of t%02d: Authenticate = %+v, %v", i, got, ok)
		}
	}
}

func TestMalformedFile(t *testing.T) {
	h := func(c string) string { return strings.Repeat(c, 64) }
	for _, tc := range []struct {
		name    string
		content string
		want    string // in the error, beside the file's path
	}{
		{"syntax", "{\n  \"tenants\": [\n    {\"name\": \"a\",}\n  ]\n}", "line 3, column"},
		{"not an object", `[]`, "line 1, column 2: the file: want a JSON object, not array"},
		{"truncated", `{"tenants": [`, "ends early"},
		{"unknown field", `{"tenants": [], "tenant": []}`, `unknown field "tenant"`},
		{"wrong type", `{"tenants": [{"name": "a", "key_sha256": "` + h("a") + `", "quota": {"max_memory": "4g"}}]}`, "tenants.quota.max_memory: want a JSON number, not string"},
		{"bad name", `{"tenants": [{"name": "A!", "key_sha256": "` + h("a") + `"}]}`, `tenant name "A!"`},
		{"no hash", `{"tenants": [{"name": "a"}]}`, "key_sha256"},
		{"short hash", `{"tenants": [{"name": "a", "key_sha256": "abcd"}]}`, `key_sha256 "abcd"`},
		{"upper hash", `{"tenants": [{"name": "a", "key_sha256": "` + h("A") + `"}]}`, "lower-case hex"},
		{"duplicate name", `{"tenants": [{"name": "a", "key_sha256": "` + h("a") + `"}, {"name": "a", "key_sha256": "` + h("b") + `"}]}`, `tenants[1] ("a"): name listed twice`},
		{"duplicate hash", `{"tenants": [{"name": "a", "key_sha256": "` + h("a") + `"}, {"name": "b", "key_sha256": "` + h("a") + `"}]}`, "key_sha256 listed twice"},
		{"negative quota", `{"tenants": [{"name": "a", "key_sha256": "` + h("a") + `", "quota": {"max_sandboxes": -1}}]}`, "max-sandboxes -1"},
		{"trailing", `{"tenants": []} {}`, "after the JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tempPath(t)
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path)
			if err == nil {
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open = %v; want ErrInvalidArgument naming %s and %q", err, path, tc.want)
			}
		})
	}
	for _, ok := range []string{"", "  \n", `{}`, `{"tenants": []}`} {
		path := tempPath(t)
		if err := os.WriteFile(path, []byte(ok), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path); err != nil {
			t.Errorf("Open of %q = %v", ok, err)
		}
	}
}

func TestAdmit(t *testing.T) {
	const gib = 1 << 30
	q := Quota{MaxSandboxes: 3, MaxCPUs: 4, MaxMemory: 4 * gib, MaxDisk: 10 * gib}
	for _, tc := range []struct {
		name       string
		q          Quota
		used, want Usage
		msg        string // "" = admitted
	}{
		{"fits", q, Usage{2, 2, 2 * gib, 5 * gib, 0}, Usage{1, 2, 2 * gib, 5 * gib, 0}, ""},
		{"unlimited", Quota{}, Usage{1000, 1000, 1000 * gib, 1000 * gib, 1000}, Usage{1, 1, gib, gib, 1}, ""},
		{"float sum", Quota{MaxCPUs: 0.3}, Usage{CPUs: 0.1}, Usage{CPUs: 0.2}, ""},
		{"sandboxes", q, Usage{Sandboxes: 3}, Usage{Sandboxes: 1},
			"tenant quota exceeded: sandboxes 3 in use + 1 asked > max-sandboxes 3"},
		{"cpus", q, Usage{Sandboxes: 1, CPUs: 3.5}, Usage{Sandboxes: 1, CPUs: 1},
			"tenant quota exceeded: cpus 3.5 in use + 1 asked > max-cpus 4"},
		{"memory", q, Usage{Memory: 3 * gib}, Usage{Memory: 2 * gib},
			"tenant quota exceeded: memory 3GiB in use + 2GiB asked > max-memory 4GiB"},
		{"disk", q, Usage{Disk: 9*gib + gib/2}, Usage{Disk: 600 << 20},
			"tenant quota exceeded: disk 9.5GiB in use + 600MiB asked > max-disk 10GiB"},
		{"exactly full", q, Usage{Sandboxes: 2, CPUs: 3, Memory: 3 * gib, Disk: 9 * gib}, Usage{Sandboxes: 1, CPUs: 1, Memory: gib, Disk: gib}, ""},
		{"two at once", q, Usage{Sandboxes: 3, Memory: 4 * gib}, Usage{Sandboxes: 1, Memory: 1},
			"tenant quota exceeded: sandboxes 3 in use + 1 asked > max-sandboxes 3; memory 4GiB in use + 1B asked > max-memory 4GiB"},
		{"snapshots", Quota{MaxSnapshots: 2}, Usage{Snapshots: 2}, Usage{Snapshots: 1},
			"tenant quota exceeded: snapshots 2 kept + 1 asked > max-snapshots 2"},
		{"a resume asks no disk of a tenant over it", q, Usage{Disk: 11 * gib}, Usage{Sandboxes: 1, CPUs: 1, Memory: gib}, ""},
		{"a snapshot asks no sandbox of a tenant at its limit", Quota{MaxSandboxes: 1, MaxSnapshots: 1}, Usage{Sandboxes: 1}, Usage{Snapshots: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.q.Admit(tc.used, tc.want)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Admit = %v; want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tc.msg {
				t.Fatalf("Admit = %v\nwant %s", err, tc.msg)
			}
			if !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Errorf("Admit's error does not wrap ErrResourceExhausted")
			}
		})
	}
}

// FuzzParse: any content is refused with an error or yields valid entries
// that survive a write and a read.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"tenants": [{"name": "a", "key_sha256": "` + strings.Repeat("a", 64) + `", "quota": {"max_cpus": 1.5}}]}`))
	f.Add([]byte(`{"tenants": [{"name": "a",}]}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := parse(b)
		if err != nil {
			return
		}
		for _, r := range recs {
			if ValidateName(r.Name) != nil || r.Quota.Validate() != nil || len(r.KeySHA256) != 64 {
				t.Fatalf("parse accepted %+v", r)
			}
		}
		path := filepath.Join(t.TempDir(), "tenants.json")
		if err := writeFile(path, recs); err != nil {
			t.Fatal(err)
		}
		again, err := readFile(path)
		if err != nil || len(again) != len(recs) {
			t.Fatalf("written file reads back as %d entries, %v; want %d", len(again), err, len(recs))
		}
	})
}
