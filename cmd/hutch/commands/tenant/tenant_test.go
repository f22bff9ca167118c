package tenant_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"hutch.dev/hutch/serve/tenant"
)

var hutchBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "hutch-tenant-test")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		hutchBin = filepath.Join(dir, "hutch")
		out, err := exec.Command("go", "build", "-o", hutchBin, "hutch.dev/hutch/cmd/hutch").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "building hutch: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

type result struct {
	stdout, stderr string
	code           int
}

func hutch(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(hutchBin, args...)
	cmd.Env = append(os.Environ(), "HUTCH_TENANTS=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("hutch %q: %v", args, err)
	}
	return r
}

var keyRE = regexp.MustCompile(`^e2b_[0-9a-f]{40}$`)

func TestTenantCommands(t *testing.T) {
	file := filepath.Join(t.TempDir(), "conf", "tenants.json")

	r := hutch(t, "tenant", "add", "acme", "--tenants", file, "--max-sandboxes", "3", "--max-cpus", "2.5", "--max-memory", "8g", "--max-disk", "100g", "--max-snapshots", "5")
	if r.code != 0 {
		t.Fatalf("tenant add: exit %d: %s", r.code, r.stderr)
	}
	keyA := strings.TrimSpace(r.stdout)
	if !keyRE.MatchString(keyA) {
		t.Fatalf("tenant add printed %q; want one key, e2b_ and 40 hex digits", r.stdout)
	}
	r = hutch(t, "tenant", "add", "--tenants", file, "beta")
	if r.code != 0 {
		t.Fatalf("tenant add beta: exit %d: %s", r.code, r.stderr)
	}
	keyB := strings.TrimSpace(r.stdout)

	s, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	wantQ := tenant.Quota{MaxSandboxes: 3, MaxCPUs: 2.5, MaxMemory: 8 << 30, MaxDisk: 100 << 30, MaxSnapshots: 5}
	if got, ok := s.Authenticate(keyA); !ok || got.Name != "acme" || got.Quota != wantQ {
		t.Errorf("the printed key authenticates as %+v, %v; want acme with %+v", got, ok, wantQ)
	}
	if got, ok := s.Authenticate(keyB); !ok || got.Name != "beta" || got.Quota != (tenant.Quota{}) {
		t.Errorf("beta's key authenticates as %+v, %v; want beta, unlimited", got, ok)
	}
	if b, _ := os.ReadFile(file); bytes.Contains(b, []byte(keyA[4:])) {
		t.Errorf("the tenants file holds a key")
	}

	r = hutch(t, "tenant", "ls", "--tenants", file, "--format", "json")
	if r.code != 0 {
		t.Fatalf("tenant ls --format json: exit %d: %s", r.code, r.stderr)
	}
	var ls []tenant.Tenant
	if err := json.Unmarshal([]byte(r.stdout), &ls); err != nil {
		t.Fatalf("tenant ls --format json: %v\n%s", err, r.stdout)
	}
	if len(ls) != 2 || ls[0].Name != "acme" || ls[0].Quota != wantQ || ls[1].Name != "beta" || ls[0].Created.IsZero() {
		t.Errorf("tenant ls --format json = %+v", ls)
	}
	if strings.Contains(r.stdout, "key") {
		t.Errorf("tenant ls shows key material:\n%s", r.stdout)
	}
	r = hutch(t, "--root", t.TempDir(), "tenant", "list", "--tenants", file)
	if r.code != 0 || !regexp.MustCompile(`(?m)^acme\s+3\s+2.5\s+8GiB\s+100GiB\s+5\s`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^beta\s+unlimited\s+unlimited\s+unlimited\s+unlimited\s+unlimited\s`).MatchString(r.stdout) {
		t.Errorf("tenant ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Refusals: exit 125, one line naming the problem, the file unchanged.
	before, _ := os.ReadFile(file)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"add", "acme"}, `tenant "acme": already exists`},
		{[]string{"add", "Acme!"}, `tenant name "Acme!"`},
		{[]string{"add", strings.Repeat("a", 64)}, "tenant name"},
		{[]string{"add", "x", "--max-memory", "8q"}, `--max-memory: invalid argument: size "8q"`},
		{[]string{"add", "x", "--max-disk", "-1g"}, `--max-disk`},
		{[]string{"add", "x", "--max-cpus", "lots"}, `--max-cpus "lots"`},
		{[]string{"add", "x", "--max-sandboxes", "1.5"}, `--max-sandboxes "1.5"`},
		{[]string{"add", "x", "--max-sandboxes", "-1"}, `--max-sandboxes "-1"`},
		{[]string{"add"}, "usage: hutch tenant add NAME"},
		{[]string{"add", "x", "y"}, "usage: hutch tenant add NAME"},
		{[]string{"add", "x", "--nope"}, "nope"},
		{[]string{"rm", "nobody"}, `tenant "nobody": not found`},
		{[]string{"add", "x", "--max-snapshots", "many"}, `--max-snapshots "many"`},
		{[]string{"set", "acme"}, "no quota given"},
		{[]string{"set", "nobody", "--max-snapshots", "1"}, `tenant "nobody": not found`},
		{[]string{"set", "acme", "--max-snapshots", "-2"}, `--max-snapshots "-2"`},
		{[]string{"set", "acme", "--max-disk", "lots"}, `--max-disk`},
		{[]string{"set"}, "usage: hutch tenant set NAME"},
		{[]string{"ls", "--format", "yaml"}, `--format "yaml"`},
	} {
		args := append([]string{"tenant"}, tc.args...)
		args = append(args, "--tenants", file)
		r := hutch(t, args...)
		if r.code != 125 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("hutch %q: exit %d, stdout %q, stderr %q; want 125 and one line with %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	if r := hutch(t, "tenant", "ls"); r.code != 125 || !strings.Contains(r.stderr, "--tenants FILE is required") {
		t.Errorf("tenant ls without --tenants: exit %d, %q", r.code, r.stderr)
	}
	if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
		t.Errorf("a refused command changed the file:\n%s\nthen:\n%s", before, after)
	}

	// set changes the limits it names and keeps the others; the key
	// stays.
	r = hutch(t, "tenant", "set", "acme", "--tenants", file, "--max-snapshots", "0", "--max-disk", "20g")
	if r.code != 0 || r.stdout != "acme\n" {
		t.Fatalf("tenant set acme: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, err := s.List(); err != nil {
		t.Fatal(err)
	}
	wantQ.MaxSnapshots, wantQ.MaxDisk = 0, 20<<30
	if got, ok := s.Authenticate(keyA); !ok || got.Quota != wantQ {
		t.Errorf("after tenant set, acme's key authenticates as %+v, %v; want %+v", got, ok, wantQ)
	}

	r = hutch(t, "tenant", "rm", "acme", "--tenants", file)
	if r.code != 0 || r.stdout != "acme\n" {
		t.Fatalf("tenant rm acme: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, ok := s.Authenticate(keyA); ok {
		// s looks at the file at most once a second; List looks now.
		if _, err := s.List(); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Authenticate(keyA); ok {
			t.Error("a removed tenant's key still authenticates")
		}
	}
	if _, ok := s.Authenticate(keyB); !ok {
		t.Error("removing acme lost beta")
	}
	if r := hutch(t, "tenant", "rm", "acme", "--tenants", file); r.code != 125 {
		t.Errorf("tenant rm of a removed tenant: exit %d", r.code)
	}
}

func TestTenantAddConcurrent(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tenants.json")
	const n = 8
	keys := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := hutch(t, "tenant", "add", fmt.Sprintf("t%d", i), "--tenants", file)
			if r.code != 0 {
				t.Errorf("tenant add t%d: exit %d: %s", i, r.code, r.stderr)
			}
			keys[i] = strings.TrimSpace(r.stdout)
		})
	}
	wg.Wait()
	s, err := tenant.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got, ok := s.Authenticate(k); !ok || got.Name != fmt.Sprintf("t%d", i) {
			t.Errorf("t%d's key: %+v, %v", i, got, ok)
		}
	}
	if ls, _ := s.List(); len(ls) != n {
		t.Errorf("%d tenants after %d concurrent `hutch tenant add`", len(ls), n)
	}
}
