package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Without root, -v mounts what the user could read (and, for :rw, write)
// itself: a directory it owns is shared both ways with a running sandbox;
// one it cannot read, or cannot write for :rw, is refused with one line
// and exit 125, and leaves no sandbox behind.
func TestRootlessVolume(t *testing.T) {
	e := newRootlessEnv(t)
	u := rootlessUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	base, err := os.MkdirTemp("", "hutch-rootless-vol-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	mkdir := func(name string, mode os.FileMode, own bool) string {
		t.Helper()
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if own {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mine := mkdir("mine", 0o755, true)
	hidden := mkdir("hidden", 0o700, false)     // root's, unreadable to the user
	readable := mkdir("readable", 0o755, false) // root's, readable, not writable
	if err := os.WriteFile(filepath.Join(readable, "f"), []byte("root's file\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("a directory the user owns is shared both ways", func(t *testing.T) {
		id := e.create("-v", mine+":/w")
		defer e.ok("rm", "-f", id)
		if err := os.WriteFile(filepath.Join(mine, "from-host"), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := e.ok("exec", id, "--", "cat", "/w/from-host"); out != "host\n" {
			t.Errorf("the sandbox reads the host's write as %q, want %q", out, "host\n")
		}
		e.ok("exec", id, "--", "sh", "-c", "echo sandbox > /w/from-sandbox")
		b, err := os.ReadFile(filepath.Join(mine, "from-sandbox"))
		if err != nil || string(b) != "sandbox\n" {
			t.Errorf("the host reads the sandbox's write as %q, %v; want %q", b, err, "sandbox\n")
		}
		// Written as the user, never as host root.
		if fi, err := os.Stat(filepath.Join(mine, "from-sandbox")); err == nil {
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
				t.Errorf("the sandbox's file is owned by uid %d on the host, want the user's %d", st.Uid, uid)
			}
		}
	})

	t.Run("read-only mount of a directory the user can read", func(t *testing.T) {
		out := e.ok("run", "--rm", "--image", "busybox", "-v", readable+":/r:ro", "--", "cat", "/r/f")
		if out != "root's file\n" {
			t.Errorf("reading through :ro: %q", out)
		}
	})

	refused := []struct {
		name, spec, words string
	}{
		{"a directory the user cannot read", hidden + ":/x:ro", "cannot read"},
		{"a directory the user cannot read, read-write", hidden + ":/x", "cannot read and write"},
		{":rw on a directory the user can read but not write", readable + ":/x:rw", "cannot read and write"},
		{"the default mode on a directory the user cannot write", readable + ":/x", "cannot read and write"},
	}
	for _, c := range refused {
		t.Run(c.name+" is refused", func(t *testing.T) {
			for _, verb := range [][]string{{"create", "--image", "busybox"}, {"run", "--rm", "--image", "busybox"}} {
				args := append(append([]string{}, verb...), "-v", c.spec)
				if verb[0] == "run" {
					args = append(args, "--", "true")
				}
				r := e.run(nil, args...)
				assertOneLineError(t, r, c.words)
				if !strings.Contains(r.stderr, strings.SplitN(c.spec, ":", 2)[0]) {
					t.Errorf("%s: the error does not name the directory: %q", verb[0], r.stderr)
				}
			}
			if ls := e.list(); len(ls) != 0 {
				t.Errorf("sandboxes left after the refused creates: %+v", ls)
			}
			if ents, _ := os.ReadDir(filepath.Join(e.root, "sandboxes")); len(ents) != 0 {
				t.Errorf("sandbox directories left after the refused creates: %d", len(ents))
			}
		})
	}
	// The refusals changed nothing on the host.
	if ents, _ := os.ReadDir(hidden); len(ents) != 0 {
		t.Errorf("%s holds %d entries after the refusals", hidden, len(ents))
	}
	if ents, _ := os.ReadDir(readable); len(ents) != 1 {
		t.Errorf("%s holds %d entries after the refusals, want its one file", readable, len(ents))
	}
}
