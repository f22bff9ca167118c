package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// sandboxCgroupDir is where the host shows sandbox id's cgroup: the memory
// controller's hierarchy on cgroup v1 (and hybrid) hosts, the unified one
// on v2.
func sandboxCgroupDir(id string) string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup/hutch/" + id
	}
	return "/sys/fs/cgroup/memory/hutch/" + id
}

// runscOwned lists what of sandbox id's cgroup runsc says it created and
// will delete: the v1 controllers its state marks as its own, or "cgroup"
// when it owns a v2 group. Empty means runsc joined a cgroup made for it.
func (e *env) runscOwned(id string) []string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.root, "runsc", id+"_sandbox:"+id+".state"))
	if err != nil {
		e.t.Fatalf("runsc state of %s: %v", id, err)
	}
	var st struct {
		Sandbox struct {
			Cgroup struct {
				V1 *struct {
					Name string          `json:"name"`
					Own  map[string]bool `json:"own"`
				} `json:"cgroupv1"`
				V2 *struct {
					Own bool `json:"own"`
				} `json:"cgroupv2"`
			} `json:"cgroup"`
		} `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		e.t.Fatalf("runsc state of %s: %v", id, err)
	}
	cg := st.Sandbox.Cgroup
	var owned []string
	switch {
	case cg.V1 != nil:
		if cg.V1.Name != "/hutch/"+id {
			e.t.Fatalf("sandbox %s runs in cgroup %q, not hutch's /hutch/%s", id, cg.V1.Name, id)
		}
		for c, own := range cg.V1.Own {
			if own {
				owned = append(owned, c)
			}
		}
	case cg.V2 != nil:
		if cg.V2.Own {
			owned = append(owned, "cgroup")
		}
	default:
		e.t.Fatalf("runsc state of %s names no cgroup: %s", id, b)
	}
	slices.Sort(owned)
	return owned
}

// assertHutchCgroup checks that sandbox id's cgroup exists under hutch's path
// and that hutch made it: runsc only joined it, so runsc never deletes it
// (docs/decisions/0004).
func (e *env) assertHutchCgroup(id, after string) {
	e.t.Helper()
	if _, err := os.Stat(sandboxCgroupDir(id)); err != nil {
		e.t.Fatalf("after %s: sandbox %s has no cgroup under hutch's path: %v", after, id, err)
	}
	if owned := e.runscOwned(id); len(owned) > 0 {
		e.t.Fatalf("after %s: runsc created sandbox %s's cgroup (owns %s), not hutch", after, id, strings.Join(owned, ", "))
	}
}

// A resumed or forked sandbox runs in a cgroup hutch made, as a created one
// does, and it goes away with the sandbox.
func TestResumeAndForkOwnCgroup(t *testing.T) {
	e := newEnv(t)
	id := e.create()
	e.assertHutchCgroup(id, "create")
	e.ok("pause", id)
	// Its runtime goes in the background once the pause returns.
	deadline := time.Now().Add(5 * time.Second)
	for _, err := os.Stat(sandboxCgroupDir(id)); err == nil; _, err = os.Stat(sandboxCgroupDir(id)) {
		if time.Now().After(deadline) {
			t.Fatalf("paused sandbox %s still has its cgroup 5s after its pause", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.ok("resume", id)
	e.assertHutchCgroup(id, "resume")
	kids := strings.Fields(e.ok("fork", "--count", "2", id))
	if len(kids) != 2 {
		t.Fatalf("fork --count 2 printed %q", kids)
	}
	for _, k := range kids {
		e.assertHutchCgroup(k, "fork")
	}
	for _, k := range append(kids, id) {
		e.ok("rm", "-f", k)
		e.assertClean(k)
		if _, err := os.Stat(sandboxCgroupDir(k)); err == nil {
			t.Fatalf("cgroup of removed sandbox %s is left", k)
		}
	}
}

// A memory bomb in a resumed sandbox is reported as an OOM kill, as in a
// created one (TestMemoryBombIsOOMKilledAlone).
func TestResumedMemoryBombIsOOMKilled(t *testing.T) {
	e := newEnv(t)
	bomb := e.create("--memory", "128m")
	e.ok("pause", bomb)
	e.ok("resume", bomb)
	r := e.run(nil, "exec", bomb, "--", "sh", "-c", "head -c 1000m /dev/zero | tail > /dev/null; echo survived")
	if r.code != 137 || !strings.Contains(r.stderr, "out of memory") || !strings.Contains(r.stderr, "128MiB") || strings.Contains(r.stdout, "survived") {
		t.Fatalf("memory bomb after resume: want exit 137 with the reason, got %s", r)
	}
	var rec struct {
		State     string `json:"state"`
		OOMKilled bool   `json:"oomKilled"`
	}
	if err := json.Unmarshal([]byte(e.ok("inspect", bomb)), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.State != "stopped" || !rec.OOMKilled {
		t.Fatalf("inspect after OOM in a resumed sandbox: %+v", rec)
	}
	e.ok("rm", bomb)
	e.assertClean(bomb)
}
