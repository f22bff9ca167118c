package buildimg

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

func TestSubIDs(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "subuid")
	os.WriteFile(f, []byte("other:100000:65536\n1001:165536:65536\nbad:x:1\nalice:231072:1000\nalice:300000:65536\n"), 0o644)
	u := &user.User{Username: "alice", Uid: "1002"}
	if r, err := subIDs(f, u, u.Uid); err != nil || r != (idRange{231072, 1000}) {
		t.Fatalf("by name: %v %v", r, err)
	}
	u = &user.User{Username: "bob", Uid: "1001"}
	if r, err := subIDs(f, u, u.Uid); err != nil || r != (idRange{165536, 65536}) {
		t.Fatalf("by UID: %v %v", r, err)
	}
	u = &user.User{Username: "carol", Uid: "1003"}
	if _, err := subIDs(f, u, u.Uid); err == nil {
		t.Fatal("a user without an entry has subordinate IDs")
	}
}

// A user without subordinate IDs is told what to add, and where.
func TestRootlessMissing(t *testing.T) {
	u, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	uid, gid := filepath.Join(dir, "subuid"), filepath.Join(dir, "subgid")
	os.WriteFile(uid, []byte(u.Username+":100000:65536\n"), 0o644)
	os.WriteFile(gid, []byte("someone-else:100000:65536\n"), 0o644)
	var about []string
	for _, m := range rootlessMissing(uid, gid) {
		if strings.Contains(m, "subordinate") {
			about = append(about, m)
		}
	}
	if len(about) != 1 || !strings.Contains(about[0], gid) || !strings.Contains(about[0], "usermod --add-subgids") || !strings.Contains(about[0], u.Username) {
		t.Fatalf("missing subgids reported as %q", about)
	}
	os.WriteFile(gid, []byte(u.Uid+":100000:65536\n"), 0o644)
	for _, m := range rootlessMissing(uid, gid) {
		if strings.Contains(m, "subordinate") {
			t.Fatalf("subordinate IDs by UID not found: %q", m)
		}
	}
}
