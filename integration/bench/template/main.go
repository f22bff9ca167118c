// Command template measures create → first answer of a template's
// service: restored warm from the template's checkpoint, claimed from a
// pool of the template, and booted cold with the same start command,
// beside a plain cold create of busybox and raw runsc restoring the same
// checkpoint, in one run, interleaved. It writes its own section of
// docs/benchmarks.md. Run it through `make bench` (as root).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/integration/bench/benchcmd"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// bin holds the binaries; root is hutch's state root, a directory of top.
var bin, top, root string

// The template: a server that takes a second to start listening, as
// services do, and answers "hi".
const (
	startCmd  = "mkdir -p /www && echo hi > /www/hi && sleep 1 && exec httpd -f -p 8000 -h /www"
	readyCmd  = "port:8000"
	firstCall = "wget -qO- http://127.0.0.1:8000/hi"
)

func hutchCmd(args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(bin, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
	return c
}

func hutch(args ...string) string {
	out, err := hutchCmd(args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// firstOutput is benchcmd.FirstOutput, ending the run on an error.
func firstOutput(c *exec.Cmd, want string) time.Duration {
	d, err := benchcmd.FirstOutput(c, want)
	if err != nil {
		benchexit.Fatal(err)
	}
	return d
}

// createThenCall times `hutch create ARGS` and then `hutch exec ID -- sh
// -c CALL` to its first output, and removes the sandbox.
func createThenCall(call string, args ...string) time.Duration {
	start := time.Now()
	id := strings.TrimSpace(hutch(append([]string{"create"}, args...)...))
	d := time.Since(start) + firstOutput(hutchCmd("exec", id, "--", "sh", "-c", call), "hi")
	hutch("rm", "-f", id)
	return d
}

type pool struct {
	Ready int `json:"ready"`
	Size  int `json:"size"`
}

// waitFull waits until pool "tpl" is full.
func waitFull() {
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(10 * time.Millisecond) {
		var ps []pool
		if err := json.Unmarshal([]byte(hutch("pool", "ls", "--format", "json")), &ps); err != nil || len(ps) != 1 {
			benchexit.Fatalf("pool ls: %v %v", ps, err)
		}
		if ps[0].Ready == ps[0].Size {
			return
		}
	}
	benchexit.Fatalf("pool did not refill within a minute")
}

var median, msf = benchcmd.Median, benchcmd.Ms

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built hutch, hutch-init, runsc and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	n := flag.Int("n", 20, "measured runs per side")
	flag.Parse()
	if os.Geteuid() != 0 {
		benchexit.Fatalf("run as root")
	}
	var err error
	if bin, err = filepath.Abs(bin); err != nil {
		benchexit.Fatal(err)
	}
	if top, err = os.MkdirTemp("", "hutch-bench-template-"); err != nil {
		benchexit.Fatal(err)
	}
	root = filepath.Join(top, "state")
	rawRoot := filepath.Join(top, "raw-runsc")
	const rawID = "bench-template-raw"
	cleanup := func() {
		hutchCmd("pool", "rm", "tpl").Run() //nolint:errcheck // best effort on the way out
		ids, _ := hutchCmd("ls", "-q").Output()
		for _, id := range strings.Fields(string(ids)) {
			hutchCmd("rm", "-f", id).Run() //nolint:errcheck
		}
		exec.Command(filepath.Join(bin, "runsc"), "--root="+rawRoot, "delete", "--force", rawID).Run() //nolint:errcheck
		removeCgroup()
		os.RemoveAll(top)
	}
	benchexit.AtExit(cleanup)
	defer cleanup()

	hutch("image", "import", "busybox", filepath.Join(bin, "images", "busybox.tar"))
	ctxDir := filepath.Join(top, "context")
	os.MkdirAll(ctxDir, 0o700)
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM busybox\n"), 0o644); err != nil {
		benchexit.Fatal(err)
	}
	build := time.Now()
	hutch("image", "build", "--progress", "quiet", "-t", "tpl", "--start-cmd", startCmd, "--ready-cmd", readyCmd, ctxDir)
	buildTime := time.Since(build)

	// A warm sandbox whose runsc flags and bundle raw runsc restores the
	// template's checkpoint with.
	ref := strings.TrimSpace(hutch("create", "--image", "tpl"))
	rawArgs, bundle, ck := rawRestore(ref, rawRoot)

	hutch("pool", "create", "tpl", "--image", "tpl", "--size", "2", "--wait")
	var warm, claim, cold, plain, raw []time.Duration
	coldCall := "(" + startCmd + ") & until " + firstCall + " 2>/dev/null; do sleep 0.05; done"
	for i := -2; i < *n; i++ {
		// Interleaved, the pool full before each claim.
		waitFull()
		c := createThenCall(firstCall, "--image", "tpl")
		waitFull()
		w := createThenCall(firstCall, "--image", "tpl", "--memory", "1g") // no pool of this class
		p := createThenCall("echo hi", "--image", "busybox")
		k := firstOutput(hutchCmd("run", "--rm", "--image", "tpl", "--memory", "1g", "--", "sh", "-c", coldCall), "hi")
		start := time.Now()
		if err := exec.Command(filepath.Join(bin, "runsc"), append(rawArgs, "restore", "--detach", "--bundle", bundle, "--image-path", ck, rawID)...).Run(); err != nil {
			benchexit.Fatalf("runsc restore: %v", err)
		}
		r := time.Since(start) + firstOutput(exec.Command(filepath.Join(bin, "runsc"), append(rawArgs, "exec", rawID, "/bin/sh", "-c", firstCall)...), "hi")
		exec.Command(filepath.Join(bin, "runsc"), "--root="+rawRoot, "delete", "--force", rawID).Run() //nolint:errcheck
		removeCgroup()
		if i < 0 {
			continue // warm-up
		}
		warm, claim, cold, plain, raw = append(warm, w), append(claim, c), append(cold, k), append(plain, p), append(raw, r)
	}

	runscVersion := "runsc ?"
	if v, err := exec.Command(filepath.Join(bin, "runsc"), "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	var w strings.Builder
	fmt.Fprintf(&w, "### Templates: create → first answer of the template's service\n\n")
	fmt.Fprintf(&w, "`go run ./integration/bench/template -bin bin -out docs/benchmarks.md` (as root; `make bench` runs it), %s, %d CPUs, %s, %s. "+
		"A template on the busybox image whose start command, `%s`, takes a second before its server listens (ready check `%s`); building it (image and checkpoints) took %s. "+
		"Medians of %d interleaved passes, each to the first line of output of `%s` in the new sandbox: "+
		"*warm*: `hutch create --image tpl --memory 1g` (a class no pool holds), restored from the template's checkpoint, then `hutch exec ID -- sh -c CALL`; "+
		"*pool*: the same without `--memory`, claimed from a full pool of 2 of the template (`hutch pool create tpl --image tpl --size 2`); "+
		"*cold*: `hutch run --rm --image tpl --memory 1g` of the start command and then the call, retried every 50 ms until the server answers: the same image and command, booted; "+
		"*plain busybox*: `hutch create --image busybox`, then `hutch exec ID -- echo hi`, the floor a warm create is held to; "+
		"*raw runsc*: `runsc restore --detach` of the same checkpoint with hutch's runsc flags and bundle (a cgroup of its own), then `runsc exec` of the call. "+
		"The machine is shared: compare rows of one run, not runs.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runscVersion,
		startCmd, readyCmd, buildTime.Round(100*time.Millisecond), *n, firstCall)
	fmt.Fprintf(&w, "| path | create → first answer |\n| --- | --- |\n")
	fmt.Fprintf(&w, "| hutch, warm (restored from the template's checkpoint) | **%s** |\n", msf(median(warm)))
	fmt.Fprintf(&w, "| hutch, pool of the template | %s |\n", msf(median(claim)))
	fmt.Fprintf(&w, "| hutch, cold `run` of the same image and start command | %s |\n", msf(median(cold)))
	fmt.Fprintf(&w, "| hutch, plain cold create of busybox, then `echo hi` | %s |\n", msf(median(plain)))
	fmt.Fprintf(&w, "| raw runsc: `runsc restore` of the checkpoint, then `runsc exec` | %s |\n\n", msf(median(raw)))
	fmt.Fprintf(&w, "Warm is %.2fx a plain cold create of busybox (aim: ≤ 1.3x), %.2fx raw runsc's restore, and %.2fx the cold boot with the start command; the pool is %.2fx warm.\n",
		float64(median(warm))/float64(median(plain)), float64(median(warm))/float64(median(raw)),
		float64(median(warm))/float64(median(cold)), float64(median(claim))/float64(median(warm)))
	if err := benchdoc.WriteSection(*out, "template", w.String()); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(w.String())
}

// rawCgroup is raw runsc's cgroup (an OCI cgroupsPath).
const rawCgroup = "/hutch-bench-template-raw"

// removeCgroup removes rawCgroup from every hierarchy, v1 or v2.
func removeCgroup() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + rawCgroup)
	more, _ := filepath.Glob("/sys/fs/cgroup" + rawCgroup)
	for _, d := range append(dirs, more...) {
		os.Remove(d)
	}
}

// rawRestore derives, from warm hutch sandbox id, raw runsc's global
// flags, a bundle that restores the template's checkpoint (the same spec
// in a cgroup of its own), and the checkpoint's directory.
func rawRestore(id, rawRoot string) ([]string, string, string) {
	dir := filepath.Join(root, "sandboxes", id)
	globals, err := benchcmd.RunscGlobals(root, id)
	if err != nil {
		benchexit.Fatal(err)
	}
	overlay := filepath.Join(top, "raw-overlay")
	os.MkdirAll(overlay, 0o700)
	var raw []string
	for _, g := range globals {
		switch {
		case strings.HasPrefix(g, "--root="):
			raw = append(raw, "--root="+rawRoot)
		case strings.HasPrefix(g, "--overlay2="):
			raw = append(raw, "--overlay2=root:dir="+overlay)
		default:
			raw = append(raw, g)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "bundle", "config.json"))
	if err != nil {
		benchexit.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		benchexit.Fatal(err)
	}
	spec.Linux.CgroupsPath = rawCgroup
	bundle := filepath.Join(top, "raw-bundle")
	os.MkdirAll(bundle, 0o700)
	sb, _ := json.Marshal(&spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), sb, 0o600); err != nil {
		benchexit.Fatal(err)
	}
	var rec struct {
		Template struct {
			Checkpoint string `json:"checkpoint"`
		} `json:"template"`
	}
	if err := json.Unmarshal([]byte(hutch("inspect", "--format", "json", id)), &rec); err != nil || rec.Template.Checkpoint == "" {
		benchexit.Fatalf("sandbox %s is not a template's: %v", id, err)
	}
	return raw, bundle, filepath.Join(root, "images", "checkpoints", strings.TrimPrefix(rec.Template.Checkpoint, "sha256:"), "image")
}
