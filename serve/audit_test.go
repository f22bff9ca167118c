package serve

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

func TestAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	// An earlier run's lines stay: the log is appended to.
	if err := os.WriteFile(path, []byte(`{"call":"earlier"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := openAudit(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	when := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	entries := []auditEntry{
		{Time: when, Tenant: "acme", Call: "POST /sandboxes", Sandbox: "abc123", Status: 201, Result: "ok", Remote: "127.0.0.1:5000"},
		{Time: when, Call: "DELETE /sandboxes/x", Status: 401, Result: "invalid API key", Remote: "127.0.0.1:5001"},
		{Tenant: "acme", Call: "POST /sandboxes", Status: 429, Result: "tenant quota exceeded: \"quoted\"\nand a newline"},
	}
	for _, e := range entries {
		a.record(e)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	a.record(entries[0]) // after Close: dropped, no panic

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v; want 0600", fi.Mode().Perm())
	}
	lines := readLines(t, path)
	if len(lines) != 1+len(entries) || !strings.Contains(lines[0], "earlier") {
		t.Fatalf("audit log has %d lines, want the earlier one then %d:\n%s", len(lines), len(entries), strings.Join(lines, "\n"))
	}
	for i, want := range entries {
		var got auditEntry
		if err := json.Unmarshal([]byte(lines[i+1]), &got); err != nil {
			t.Fatalf("line %d %q: %v", i+2, lines[i+1], err)
		}
		if want.Time.IsZero() {
			if time.Since(got.Time) > time.Minute {
				t.Errorf("line %d: time %v; want now", i+2, got.Time)
			}
			want.Time = got.Time
		}
		if !got.Time.Equal(want.Time) {
			t.Errorf("line %d: time %v; want %v", i+2, got.Time, want.Time)
		}
		got.Time, want.Time = time.Time{}, time.Time{}
		if got != want {
			t.Errorf("line %d = %+v; want %+v", i+2, got, want)
		}
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "tenant", "call", "sandbox", "status", "result", "remote"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("entry lacks %q: %s", k, lines[1])
		}
	}
}

func TestAuditLogConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	// Two logs on one file, as two servers (or a restart) would share it.
	a1, err := openAudit(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := openAudit(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 200
	long := strings.Repeat("x", auditBounds.result) // lines longer than a small buffer
	var wg sync.WaitGroup
	for w := range writers {
		a := a1
		if w%2 == 1 {
			a = a2
		}
		wg.Go(func() {
			for i := range each {
				a.record(auditEntry{Tenant: fmt.Sprintf("t%d", w), Call: "POST /sandboxes", Sandbox: fmt.Sprint(i), Status: 201, Result: long})
			}
		})
	}
	wg.Wait()
	for _, a := range []*auditLog{a1, a2} {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	lines := readLines(t, path)
	if len(lines) != writers*each {
		t.Fatalf("%d lines; want %d", len(lines), writers*each)
	}
	seen := map[string]bool{}
	for n, l := range lines {
		var e auditEntry
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %d does not parse (interleaved?): %v", n+1, err)
		}
		if e.Result != long {
			t.Fatalf("line %d: result cut or mixed", n+1)
		}
		seen[e.Tenant+"/"+e.Sandbox] = true
	}
	if len(seen) != writers*each {
		t.Errorf("%d distinct entries; want %d", len(seen), writers*each)
	}
}

func TestAuditLogNoPath(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	a, err := openAudit("", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	a.record(auditEntry{Call: "POST /sandboxes", Result: "ok"})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a log with no path wrote %s", ents[0].Name())
	}
	if _, err := openAudit(filepath.Join(dir, "missing", "audit.log"), 0, 0); err == nil || !strings.Contains(err.Error(), "missing/audit.log") {
		t.Errorf("openAudit in a missing directory = %v; want an error naming the path", err)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

func TestAuditLogBounds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	a, err := openAudit(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	long := "/sandboxes/" + strings.Repeat("A", 500<<10)
	a.record(auditEntry{Tenant: "acme", Call: "DELETE " + long, Sandbox: long, Status: 404, Result: "sandbox " + long + " not found", Remote: "127.0.0.1:1"})
	r := httptest.NewRequest("DELETE", long, nil)
	a.refused(r, 401, fmt.Errorf("missing API key: %w", errdefs.ErrUnauthenticated))
	a.record(auditEntry{Tenant: "acme", Call: "POST /sandboxes", Status: 201, Result: "ok"})
	a.Close()
	lines := readLines(t, path)
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3", len(lines))
	}
	for i, max := range []int{2048, 400, 200} {
		if len(lines[i]) > max {
			t.Errorf("line %d has %d bytes, want at most %d", i+1, len(lines[i]), max)
		}
		var e auditEntry
		if err := json.Unmarshal([]byte(lines[i]), &e); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if want := i < 2; e.Truncated != want || strings.Contains(lines[i], "bytes more") != want {
			t.Errorf("line %d: truncated %v, want %v: %s", i+1, e.Truncated, want, lines[i])
		}
	}
	if !strings.Contains(lines[1], `"status":401`) || !strings.Contains(lines[1], "missing API key") {
		t.Errorf("the refused call's line lacks its status or result: %s", lines[1])
	}
}

func TestAuditLogRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	a, err := openAudit(path, 4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		a.record(auditEntry{Tenant: "acme", Call: "POST /sandboxes", Sandbox: fmt.Sprintf("sb%04d", i), Status: 201, Result: "ok"})
	}
	a.Close()
	names, _ := filepath.Glob(path + "*")
	if want := []string{path, path + ".1", path + ".2"}; fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	var all []string
	for _, f := range []string{path + ".2", path + ".1", path} {
		fi, err := os.Stat(f)
		if err != nil || fi.Size() > 4096 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, size %d mode %v: want at most 4096 bytes, 0600", f, err, fi.Size(), fi.Mode().Perm())
		}
		all = append(all, readLines(t, f)...)
	}
	// The kept files hold the newest lines, in order, up to the last.
	for i, l := range all {
		want := fmt.Sprintf(`"sandbox":"sb%04d"`, n-len(all)+i)
		if !strings.Contains(l, want) {
			t.Fatalf("line %d of the kept files is %s, want %s", i+1, l, want)
		}
	}
}
