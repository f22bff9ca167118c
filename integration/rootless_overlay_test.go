package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// An unprivileged user's :overlay workspace works as root's: the
// sandbox writes to a layer of its own, never to the host directory;
// `hutch diff` lists what changed (deletions, a directory removed and made
// again, a directory renamed); a fork gets its own copy of the layer;
// pause and resume keep it; `diff --apply` makes the host match, as the
// user. With a network, the sandbox's namespaces hold both.
func TestRootlessOverlayWorkspace(t *testing.T) {
	e := newRootlessEnv(t)
	host := filepath.Join(filepath.Dir(e.root), "project")
	writeFiles(t, filepath.Dir(e.root), map[string]string{
		"project/a.txt": "hello\n", "project/del.txt": "gone\n", "project/od/old": "old\n",
		"project/mv/f": "moved\n", "project/same.txt": "same\n",
	})
	if err := filepath.Walk(host, func(p string, _ os.FileInfo, _ error) error {
		return os.Lchown(p, int(e.cred.Uid), int(e.cred.Gid))
	}); err != nil {
		t.Fatal(err)
	}
	before := treeHash(t, host)

	id := e.create("-v", host+":/work:overlay")
	e.ok("exec", id, "--", "sh", "-c", `set -e
		echo changed >> /work/a.txt
		echo new > /work/new.txt
		rm /work/del.txt
		rm -r /work/od && mkdir /work/od && echo n > /work/od/new
		mv /work/mv /work/moved`)
	if got := treeHash(t, host); got != before {
		t.Fatalf("the sandbox's writes reached the host directory:\nbefore:\n%s\nafter:\n%s", before, got)
	}
	want := strings.Join([]string{
		"M /work/a.txt",
		"D /work/del.txt",
		"A /work/moved/",
		"A /work/moved/f",
		"D /work/mv/",
		"D /work/mv/f",
		"A /work/new.txt",
		// od was removed and made again (opaque): old is gone.
		"A /work/od/new",
		"D /work/od/old",
	}, "\n") + "\n"
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("hutch diff --name-status:\n%s\nwant:\n%s", got, want)
	}
	if patch := e.ok("diff", id); !strings.Contains(patch, "--- a/work/a.txt\n+++ b/work/a.txt\n@@ -1 +1,2 @@\n hello\n+changed\n") {
		t.Fatalf("hutch diff:\n%s", patch)
	}

	fork := strings.Fields(e.ok("fork", id))[0]
	e.ok("exec", fork, "--", "sh", "-c", "echo fork > /work/fork-only")
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("the fork's writes reached its parent's workspace:\n%s", got)
	}
	if got := e.ok("diff", "--name-status", fork, "/work/fork-only"); got != "A /work/fork-only\n" {
		t.Fatalf("fork's diff: %q", got)
	}
	e.ok("pause", id)
	if got := e.ok("diff", "--name-status", id); got != want {
		t.Fatalf("hutch diff of a paused sandbox:\n%s", got)
	}
	e.ok("resume", id)
	if got := e.ok("exec", id, "--", "cat", "/work/od/new", "/work/moved/f"); got != "n\nmoved\n" {
		t.Fatalf("the workspace after resume: %q", got)
	}

	e.ok("diff", "--apply", id)
	if got := e.ok("diff", "--name-status", id); strings.Contains(got, "a.txt") || strings.Contains(got, "moved") || strings.Contains(got, "new.txt") {
		t.Fatalf("after --apply the sandbox still differs from the host:\n%s", got)
	}
	for name, content := range map[string]string{"a.txt": "hello\nchanged\n", "new.txt": "new\n", "od/new": "n\n", "moved/f": "moved\n"} {
		p := filepath.Join(host, name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Errorf("host %s after --apply: %q %v, want %q", name, b, err, content)
			continue
		}
		if st, _ := os.Stat(p); st.Sys().(*syscall.Stat_t).Uid != e.cred.Uid {
			t.Errorf("host %s after --apply is not the user's", name)
		}
	}
	for _, name := range []string{"del.txt", "od/old", "mv"} {
		if _, err := os.Lstat(filepath.Join(host, name)); !os.IsNotExist(err) {
			t.Errorf("host %s after --apply: %v, want it gone", name, err)
		}
	}
	for _, x := range []string{fork, id} {
		e.ok("rm", "-f", x)
		e.assertClean(x)
	}

	// With a network too: one user namespace holds both.
	usableTun(t)
	w := newTestWorld(t)
	id = e.create("-v", host+":/work:overlay", "--net", "open")
	e.ok("exec", id, "--", "sh", "-c", "echo net > /work/net.txt")
	mustReach(t, e, id, w.public, "80")
	mustNotReach(t, e, id, w.metadata, "80")
	if got := e.ok("diff", "--name-status", id); got != "A /work/net.txt\n" {
		t.Fatalf("diff of a workspace with a network: %q", got)
	}
	e.ok("rm", "-f", id)
	e.assertClean(id)
}
