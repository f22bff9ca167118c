package agent

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Entries get their owner and mode; none through a link, with "..", or on
// another mount changes anything.
func TestApplyOwnersRefusals(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	root := t.TempDir()
	outside := t.TempDir()
	for _, f := range []string{filepath.Join(root, "own"), filepath.Join(outside, "victim"), filepath.Join(root, "m", "f")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "abs")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "victim"), filepath.Join(root, "last")); err != nil {
		t.Fatal(err)
	}
	list := strings.Join([]string{
		`1234 4321 4755 "/own"`,
		`1234 4321 644 "/abs/victim"`,
		`1234 4321 644 "/m/../abs/victim"`,
		`1234 4321 644 "/m/f"`,
		`1234 4321 777 "/last"`,
		`1234 4321 644 "/missing"`,
	}, "\n") + "\n"
	var warn strings.Builder
	if err := ApplyOwners(root, strings.NewReader(list), []string{"/", "/m"}, &warn); err != nil {
		t.Fatal(err)
	}
	check := func(p string, uid uint32, mode os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != uid || fi.Mode()&(os.ModePerm|os.ModeSetuid) != mode {
			t.Errorf("%s: %d %v, want %d %v", p, st.Uid, fi.Mode(), uid, mode)
		}
	}
	check(filepath.Join(root, "own"), 1234, 0o755|os.ModeSetuid)
	check(filepath.Join(outside, "victim"), 0, 0o644)
	check(filepath.Join(root, "m", "f"), 0, 0o644)
	check(filepath.Join(root, "last"), 1234, 0o777) // the link itself
	for _, p := range []string{"/abs/victim", "/m/../abs/victim", "/m/f", "/missing"} {
		if !strings.Contains(warn.String(), `"`+p+`" skipped`) {
			t.Errorf("no note of %s skipped: %s", p, warn.String())
		}
	}
	if err := ApplyOwners(root, strings.NewReader("1 2 3\n"), nil, &warn); err == nil {
		t.Error("a bad line was accepted")
	}
}
