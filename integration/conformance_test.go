package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The conformance suite runs one set of probes through both front ends,
// CLI sandboxes and CRI pods, and holds both to the same expectations: a
// pod gets the sandbox a CLI sandbox gets.

// sandboxSpec is what a probe asks of a sandbox; each front end renders
// it its own way (CLI flags, pod annotations and mounts).
type sandboxSpec struct {
	name    string
	pids    int
	memory  string
	network string
	allow   []string
	// secretFile, when set, is a file whose contents the sandbox gets as
	// the secret /run/secrets/TOKEN.
	secretFile string
}

// frontEnd makes sandboxes through one front end.
type frontEnd interface {
	name() string
	// start makes a sandbox as s asks, with the probe program at /probe.
	start(s sandboxSpec) probed
}

// probed is one running sandbox of a front end.
type probed interface {
	// exec runs args in the sandbox.
	exec(args ...string) result
	// ended waits for the sandbox to end and says whether its front end
	// reports it as out of memory.
	ended() (ended, oom bool, detail string)
	// stateDirs are the host directories where the front end keeps the
	// sandbox's state.
	stateDirs() []string
	remove()
}

// cliFrontEnd: `hutch create` and `hutch exec`.
type cliFrontEnd struct {
	e     *env
	probe string
}

func (f *cliFrontEnd) name() string { return "CLI sandbox" }

func (f *cliFrontEnd) start(s sandboxSpec) probed {
	f.e.t.Helper()
	args := []string{"--image", "busybox", "--net", s.network}
	if s.pids > 0 {
		args = append(args, "--pids", strconv.Itoa(s.pids))
	}
	if s.memory != "" {
		args = append(args, "--memory", s.memory)
	}
	for _, a := range s.allow {
		args = append(args, "--allow", a)
	}
	if s.secretFile != "" {
		args = append(args, "--secret", "TOKEN=@"+s.secretFile)
	}
	id := f.e.create(args...)
	f.e.copyIn(id, f.probe, "/probe")
	return &cliSandbox{e: f.e, id: id}
}

type cliSandbox struct {
	e  *env
	id string
}

func (b *cliSandbox) exec(args ...string) result {
	return b.e.run(nil, append([]string{"exec", "--timeout", "60s", b.id, "--"}, args...)...)
}

func (b *cliSandbox) ended() (bool, bool, string) {
	var rec struct {
		State     string `json:"state"`
		OOMKilled bool   `json:"oomKilled"`
	}
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out = b.e.ok("inspect", b.id)
		if err := json.Unmarshal([]byte(out), &rec); err != nil {
			b.e.t.Fatalf("inspect %s: %v", b.id, err)
		}
		if rec.State == "stopped" {
			break
		}
	}
	return rec.State == "stopped", rec.OOMKilled, out
}

func (b *cliSandbox) stateDirs() []string { return []string{b.e.root} }

func (b *cliSandbox) remove() { b.e.ok("rm", "-f", b.id) }

// podFrontEnd: a CRI pod through crictl, under an operator options file
// whose ceiling every spec fits (network open).
type podFrontEnd struct {
	c     *ctrd
	probe string
}

func newPodFrontEnd(t *testing.T, probe string) *podFrontEnd {
	c := newContainerd(t)
	c.setupCRI()
	c.setShimConfig(`network = "open"`)
	return &podFrontEnd{c: c, probe: probe}
}

func (f *podFrontEnd) name() string { return "pod" }

func (f *podFrontEnd) start(s sandboxSpec) probed {
	c := f.c
	c.t.Helper()
	ann := map[string]string{"dev.hutch.network": s.network}
	if s.pids > 0 {
		ann["dev.hutch.pids"] = strconv.Itoa(s.pids)
	}
	if s.memory != "" {
		ann["dev.hutch.memory"] = s.memory
	}
	if len(s.allow) > 0 {
		ann["dev.hutch.allow"] = strings.Join(s.allow, ",")
	}
	mounts := map[string]string{"/probe": f.probe}
	if s.secretFile != "" {
		// As kubelet delivers a Secret volume: a memory filesystem of
		// the host, mounted read-only.
		mounts["/run/secrets"] = filepath.Dir(s.secretFile)
	}
	podCfg := c.podConfig("conf-"+s.name, ann, "")
	pod := c.crictlOK("runp", "--runtime", "hutch", podCfg)
	ctr := c.crictlOK("create", pod, c.probeContainerConfig("conf-"+s.name, mounts, "sleep", "100000"), podCfg)
	c.crictlOK("start", ctr)
	return &podSandbox{c: c, pod: pod, ctr: ctr}
}

type podSandbox struct {
	c        *ctrd
	pod, ctr string
}

func (b *podSandbox) exec(args ...string) result {
	return b.c.crictl(append([]string{"exec", "-s", "--timeout", "60", b.ctr}, args...)...)
}

func (b *podSandbox) ended() (bool, bool, string) {
	var st struct {
		Status struct {
			State    string `json:"state"`
			Reason   string `json:"reason"`
			ExitCode int    `json:"exitCode"`
		} `json:"status"`
	}
	var out string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out = b.c.crictlOK("inspect", b.ctr)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			b.c.t.Fatalf("crictl inspect %s: %v", b.ctr, err)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			break
		}
	}
	return st.Status.State == "CONTAINER_EXITED", st.Status.Reason == "OOMKilled",
		fmt.Sprintf("state %s, reason %q, exit code %d", st.Status.State, st.Status.Reason, st.Status.ExitCode)
}

func (b *podSandbox) stateDirs() []string { return []string{b.c.dir} }

func (b *podSandbox) remove() {
	b.c.crictlOK("rmp", "-f", b.pod)
}

// probeContainerConfig is a crictl container config running cmd, with
// host paths mounted read-only (container path: host path).
func (c *ctrd) probeContainerConfig(name string, mounts map[string]string, cmd ...string) string {
	q := make([]string, len(cmd))
	for i, a := range cmd {
		q[i] = strconv.Quote(a)
	}
	var ms []string
	for _, p := range slices.Sorted(maps.Keys(mounts)) {
		ms = append(ms, fmt.Sprintf(`{"container_path":%q,"host_path":%q,"readonly":true}`, p, mounts[p]))
	}
	return c.writeJSON("ctr-"+name+".json", fmt.Sprintf(`{"metadata":{"name":%q},"image":{"image":%q},"command":[%s],"log_path":%q,"mounts":[%s]}`,
		name, criBusyboxImage, strings.Join(q, ","), name+".log", strings.Join(ms, ",")))
}

// conformanceProbes runs every probe through front end fe and reports
// what each found, as "probe/what" keys with normalized values.
func conformanceProbes(t *testing.T, fe frontEnd, w *testWorld, secretFile, secret string) map[string]string {
	t.Helper()
	got := map[string]string{}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}

	// Limits, seccomp and secrets, in one sandbox that the memory bomb
	// ends last.
	sb := fe.start(sandboxSpec{name: "limits", pids: 32, memory: "128m", network: "none", secretFile: secretFile})

	// Seccomp: every operation the probe program tries, as it ended.
	r := sb.exec("/probe")
	var ops map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &ops); err != nil {
		t.Fatalf("%s: probe output %s: %v", fe.name(), r, err)
	}
	for op, v := range ops {
		got["seccomp/"+op] = v
	}

	// The process limit: the shell forks short sleepers with builtins
	// only until it cannot; a subshell does it, so that the command
	// itself ends well and shows its output. The sandbox lives on, and
	// forks again once the sleepers are gone.
	r = sb.exec("sh", "-c", `ulimit -u; (i=0; while [ $i -lt 60 ]; do sleep 3 & i=$((i+1)); echo started $i; done); exit 0`)
	out := r.stdout + r.stderr // crictl exec may pass stderr on as stdout
	lines := strings.Split(out, "\n")
	n := -1
	for _, l := range lines {
		fmt.Sscanf(l, "started %d", &n)
	}
	got["pids/ulimit -u"] = lines[0]
	got["pids/a fork fails before the limit"] = yes(n >= 8 && n < 32 && strings.Contains(out, "can't fork"))
	alive := false
	for deadline := time.Now().Add(30 * time.Second); !alive && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		r := sb.exec("sh", "-c", "sleep 0 & sleep 0 & wait; echo alive")
		alive = r.code == 0 && strings.Contains(r.stdout, "alive")
	}
	got["pids/the sandbox lives on"] = yes(alive)

	// Secrets: readable inside, at rest in no file of the front end's.
	r = sb.exec("cat", "/run/secrets/TOKEN")
	// crictl exec ends the output with a newline of its own.
	got["secrets/readable inside"] = yes(r.code == 0 && strings.TrimRight(r.stdout, "\n") == secret)
	if got["secrets/readable inside"] != "yes" {
		t.Logf("%s: cat /run/secrets/TOKEN: %s", fe.name(), r)
	}
	found := ""
	for _, d := range sb.stateDirs() {
		if p := findInTree(d, []byte(secret)); p != "" {
			found = p
		}
	}
	got["secrets/in a file of the front end"] = yes(found != "")
	if found != "" {
		t.Logf("%s: the secret is in %s", fe.name(), found)
	}

	// Memory: the limit is what the sandbox sees, and a bomb past it is
	// killed with the sandbox, which its front end reports as OOM.
	r = sb.exec("grep", "MemTotal", "/proc/meminfo")
	got["memory/MemTotal"] = strings.Join(strings.Fields(strings.TrimPrefix(strings.TrimSpace(r.stdout), "MemTotal:")), " ")
	r = sb.exec("sh", "-c", "head -c 1000m /dev/zero | tail > /dev/null; echo survived")
	got["memory/the bomb survives"] = yes(strings.Contains(r.stdout, "survived"))
	ended, oom, detail := sb.ended()
	got["memory/the sandbox ends"] = yes(ended)
	got["memory/reported as out of memory"] = yes(oom)
	if !oom {
		t.Logf("%s after the memory bomb: %s\nbomb: %s", fe.name(), detail, r)
	}
	sb.remove()

	// Network: each mode against the test hosts, every target at once.
	targets := map[string]string{"public": w.public, "other public": w.other, "private": w.testHost, "metadata": w.metadata}
	for _, mode := range []string{"none", "allow", "open"} {
		spec := sandboxSpec{name: "net-" + mode, network: mode}
		if mode == "allow" {
			spec.allow = []string{w.public}
		}
		sb := fe.start(spec)
		var script strings.Builder
		for _, name := range slices.Sorted(maps.Keys(targets)) {
			fmt.Fprintf(&script, `(if printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 %s 80 | grep -q testhost; then echo "%s=reached"; else echo "%s=denied"; fi) & `,
				targets[name], name, name)
		}
		script.WriteString("wait")
		r := sb.exec("sh", "-c", script.String())
		for _, name := range slices.Sorted(maps.Keys(targets)) {
			v := "no answer"
			for _, l := range strings.Split(r.stdout+r.stderr, "\n") {
				if k, res, ok := strings.Cut(strings.TrimSpace(l), "="); ok && k == name {
					v = res
				}
			}
			got["network "+mode+"/"+name] = v
		}
		sb.remove()
	}
	return got
}

// findInTree returns a regular file below dir that contains needle.
func findInTree(dir string, needle []byte) string {
	found := ""
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || found != "" || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, needle) {
			found = p
		}
		return nil
	})
	return found
}

// tmpfsSecret writes a secret into a file on a memory filesystem of the
// test's own, as kubelet keeps a Secret volume and as a user keeps a
// secret they pass with --secret NAME=@file.
func tmpfsSecret(t *testing.T, value string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	p := filepath.Join(dir, "TOKEN")
	if err := os.WriteFile(p, []byte(value), 0o400); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every probe ends the same way through both front ends, and the way a
// sandbox must: the seccomp profile in force (denied calls fail with
// EPERM), the process and memory limits holding, network none, allow and
// open reaching only what they should, secrets readable inside and in no
// file of the front end's.
func TestConformance(t *testing.T) {
	e := newEnv(t)
	probe := buildProbe(t)
	w := newTestWorld(t)
	secret := randomSecret(t)
	secretFile := tmpfsSecret(t, secret)

	want := map[string]string{
		"seccomp/unshare_net": "EPERM",
		"seccomp/bpf":         "EPERM",

		"pids/ulimit -u":                     "32",
		"pids/a fork fails before the limit": "yes",
		"pids/the sandbox lives on":          "yes",

		"secrets/readable inside":            "yes",
		"secrets/in a file of the front end": "no",

		"memory/MemTotal":                  strconv.Itoa(128<<10) + " kB",
		"memory/the bomb survives":         "no",
		"memory/the sandbox ends":          "yes",
		"memory/reported as out of memory": "yes",

		"network none/public":       "denied",
		"network none/other public": "denied",
		"network none/private":      "denied",
		"network none/metadata":     "denied",

		"network allow/public":       "reached",
		"network allow/other public": "denied",
		"network allow/private":      "denied",
		"network allow/metadata":     "denied",

		"network open/public":       "reached",
		"network open/other public": "reached",
		"network open/private":      "denied",
		"network open/metadata":     "denied",
	}

	cli := conformanceProbes(t, &cliFrontEnd{e: e, probe: probe}, w, secretFile, secret)
	pod := conformanceProbes(t, newPodFrontEnd(t, probe), w, secretFile, secret)

	for _, k := range slices.Sorted(maps.Keys(want)) {
		if cli[k] != want[k] || pod[k] != want[k] {
			t.Errorf("%s: want %q; CLI sandbox %q, pod %q", k, want[k], cli[k], pod[k])
		}
	}
	// The seccomp probe's other operations: the same in both.
	for _, k := range slices.Sorted(maps.Keys(cli)) {
		if _, ok := want[k]; !ok && pod[k] != cli[k] {
			t.Errorf("%s: CLI sandbox %q, pod %q", k, cli[k], pod[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(pod)) {
		if _, ok := cli[k]; !ok {
			t.Errorf("%s: only the pod has it (%q)", k, pod[k])
		}
	}
}
