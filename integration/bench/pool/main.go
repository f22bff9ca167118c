// Command pool measures create → first output through a warm pool claim
// beside a fresh create and raw runsc, in one run, interleaved, and writes
// the result into its own section of docs/benchmarks.md. Run it through
// `make bench` (as root).
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
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"hutch.dev/hutch/integration/bench/benchcmd"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// bin holds the binaries; root is hutch's state root, a directory of top.
var bin, top, root string

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

// toExit times c to its exit, which must be 0.
func toExit(c *exec.Cmd) time.Duration {
	start := time.Now()
	if out, err := c.CombinedOutput(); err != nil {
		benchexit.Fatalf("%s: %v: %s", strings.Join(c.Args, " "), err, out)
	}
	return time.Since(start)
}

// createThenEcho times `hutch create ARGS` to its ID, then `hutch exec ID --
// echo hi` to its first output; it returns the ID.
func createThenEcho(args ...string) (string, time.Duration, time.Duration) {
	start := time.Now()
	id := strings.TrimSpace(hutch(append([]string{"create", "--image", "busybox"}, args...)...))
	create := time.Since(start)
	exec := firstOutput(hutchCmd("exec", id, "--", "echo", "hi"), "hi")
	return id, create, exec
}

type pool struct {
	Ready int `json:"ready"`
	Size  int `json:"size"`
}

// waitFull waits until pool "bench" is full and returns how long it took.
func waitFull() time.Duration {
	start := time.Now()
	for time.Since(start) < time.Minute {
		var ps []pool
		if err := json.Unmarshal([]byte(hutch("pool", "ls", "--format", "json")), &ps); err != nil || len(ps) != 1 {
			benchexit.Fatalf("pool ls: %v %v", ps, err)
		}
		if ps[0].Ready == ps[0].Size {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	benchexit.Fatalf("pool did not refill within a minute")
	return 0
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
	if top, err = os.MkdirTemp("", "hutch-bench-pool-"); err != nil {
		benchexit.Fatal(err)
	}
	root = filepath.Join(top, "state")
	rawRoot := filepath.Join(top, "raw-runsc")
	const rawID = "bench-pool-raw"
	cleanup := func() {
		hutchCmd("pool", "rm", "bench").Run() //nolint:errcheck // best effort on the way out
		ids, _ := hutchCmd("ls", "-q").Output()
		for _, id := range strings.Fields(string(ids)) {
			hutchCmd("rm", "-f", id).Run() //nolint:errcheck
		}
		exec.Command(filepath.Join(bin, "runsc"), "--root="+rawRoot, "delete", "--force", rawID).Run() //nolint:errcheck
		removeCgroup()
		for syscall.Unmount(filepath.Join(rawRoot, "null-netns"), syscall.MNT_DETACH) == nil {
		}
		os.RemoveAll(top)
	}
	benchexit.AtExit(cleanup)
	defer cleanup()

	// A running sandbox for exec, whose spec and runsc flags raw runsc
	// reuses.
	running := strings.TrimSpace(hutch("create", "--image", "busybox"))
	rawArgs, bundle := rawRunsc(running, rawRoot, rawID)

	hutch("pool", "create", "bench", "--image", "busybox", "--size", "2", "--wait")
	var claimC, claimE, claimT, runT, freshC, freshE, freshT, raw, execT, refill, proc, runExit, coldExit []time.Duration
	for i := -2; i < *n; i++ {
		// Interleaved: claim, fresh, raw, exec; the pool full before each
		// claim, every sandbox removed after its pass.
		waitFull()
		id, c, e := createThenEcho()
		refillD := waitFull()
		hutch("rm", "-f", id)
		// The same claim by one process, which runs the command too.
		run := firstOutput(hutchCmd("run", "--rm", "--image", "busybox", "--", "echo", "hi"), "hi")
		waitFull()
		// The same to the run's exit, pooled and cold (a class no pool
		// holds: the command is the booted sandbox's init).
		rx := toExit(hutchCmd("run", "--rm", "--image", "busybox", "--", "echo", "hi"))
		waitFull()
		cx := toExit(hutchCmd("run", "--rm", "--image", "busybox", "--memory", "1g", "--", "echo", "hi"))
		id2, fc, fe := createThenEcho("--memory", "1g") // no pool of this class: a fresh boot
		hutch("rm", "-f", id2)
		r := firstOutput(exec.Command(filepath.Join(bin, "runsc"), append(rawArgs, "run", "--bundle", bundle, rawID)...), "hi")
		exec.Command(filepath.Join(bin, "runsc"), "--root="+rawRoot, "delete", "--force", rawID).Run() //nolint:errcheck
		removeCgroup()
		x := firstOutput(hutchCmd("exec", running, "--", "echo", "hi"), "hi")
		start := time.Now()
		hutch("ls", "-q")
		l := time.Since(start)
		if i < 0 {
			continue // warm-up
		}
		claimC, claimE, claimT, runT = append(claimC, c), append(claimE, e), append(claimT, c+e), append(runT, run)
		freshC, freshE, freshT = append(freshC, fc), append(freshE, fe), append(freshT, fc+fe)
		raw, execT, refill = append(raw, r), append(execT, x), append(refill, refillD)
		proc = append(proc, l)
		runExit, coldExit = append(runExit, rx), append(coldExit, cx)
	}

	runscVersion := "runsc ?"
	if v, err := exec.Command(filepath.Join(bin, "runsc"), "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	mc, mrun, mr, mx := median(claimT), median(runT), median(raw), median(execT)
	var w strings.Builder
	fmt.Fprintf(&w, "### Warm pool: create → first output\n\n")
	fmt.Fprintf(&w, "`go run ./integration/bench/pool -bin bin -out docs/benchmarks.md` (as root; `make bench` runs it), %s, %d CPUs, %s, %s. Busybox image; medians of %d interleaved passes, each: "+
		"*pool run*: `hutch run --rm --image busybox -- echo hi` with a full pool of 2 (`hutch pool create bench --size 2`) of its class, to the first byte of output: one process claims and runs the command; "+
		"*pool claim*: the same claim as `hutch create --image busybox`, then `hutch exec ID -- echo hi` to the first byte of output, two processes; "+
		"*fresh create*: the same with `--memory 1g`, a class no pool holds, so the sandbox boots; "+
		"*raw runsc*: `runsc run` of `echo hi` with hutch's spec and runsc flags (no network; a cgroup of the same limits), to its first output; "+
		"*exec*: `hutch exec ID -- echo hi` into a sandbox running since the start. "+
		"*to exit*: `hutch run --rm --image busybox -- echo hi` until the process exits, from a full pool and, cold, with `--memory 1g`. "+
		"*refill* is from the claim's end until `hutch pool ls` shows the pool full again (polled every 10 ms). The machine is shared: compare columns, not runs.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runscVersion, *n)
	fmt.Fprintf(&w, "| path | create | first exec → first output | create → first output |\n| --- | --- | --- | --- |\n")
	fmt.Fprintf(&w, "| hutch, pool run (one process) | | | **%s** |\n", msf(mrun))
	fmt.Fprintf(&w, "| hutch, pool claim (create, then exec) | %s | %s | %s |\n", msf(median(claimC)), msf(median(claimE)), msf(mc))
	fmt.Fprintf(&w, "| hutch, fresh create | %s | %s | %s |\n", msf(median(freshC)), msf(median(freshE)), msf(median(freshT)))
	fmt.Fprintf(&w, "| raw runsc (`runsc run`) | | | %s |\n", msf(mr))
	fmt.Fprintf(&w, "| hutch exec into a running sandbox | | | %s |\n\n", msf(mx))
	fmt.Fprintf(&w, "| `hutch run --rm` to its exit | median |\n| --- | --- |\n| from the pool | **%s** |\n| cold | %s |\n\n", msf(median(runExit)), msf(median(coldExit)))
	fmt.Fprintf(&w, "Pooled `run --rm` exits %.1fx faster than cold (aim: ≥ 3x). The run returns with the command's status once its sandbox has gone from every view; a detached hutch tears it down (runsc's delete, the network, the rootfs), and `hutch ls` finishes a teardown whose remover died.\n\n",
		float64(median(coldExit))/float64(median(runExit)))
	fmt.Fprintf(&w, "Pool run → first output is %.2fx raw runsc's create → first output, %.2fx a fresh hutch create's, and %.2fx `hutch exec` into a running sandbox (aims: ≤ 30 ms, ≤ 1.3x exec); as create, then exec: %.2fx exec. Refill of one claimed sandbox: %s (median).\n\n",
		float64(mrun)/float64(mr), float64(mrun)/float64(median(freshT)), float64(mrun)/float64(mx), float64(mc)/float64(mx), msf(median(refill)))
	fmt.Fprintf(&w, "Where the time goes: starting a hutch process that opens the state root costs %s (`hutch ls -q`, median), most of it the package initialization of the libraries linked in; "+
		"an exec into a running sandbox is that plus the command's start in the sandbox; the pool run adds the claim (image lookup, one rename, the record written once) to an exec, %s here (pool run minus exec, medians). "+
		"The refill does not compete with the claimer's command: its filler is started as the claimer's process ends, and waits out its delay in a shell's `sleep` rather than in a starting hutch. "+
		"`create` then `exec` pays the process start twice.\n",
		msf(median(proc)), msf(mrun-mx))
	if err := benchdoc.WriteSection(*out, "pool", w.String()); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(w.String())
}

// rawCgroup is raw runsc's cgroup (an OCI cgroupsPath).
const rawCgroup = "/hutch-bench-pool-raw"

// removeCgroup removes rawCgroup from every hierarchy, v1 or v2.
func removeCgroup() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*" + rawCgroup)
	more, _ := filepath.Glob("/sys/fs/cgroup" + rawCgroup)
	for _, d := range append(dirs, more...) {
		os.Remove(d)
	}
}

// rawRunsc derives raw runsc's global flags and a bundle running `echo
// hi` from hutch sandbox id's: the same spec and flags, without hutch's
// network namespace and init, in a cgroup of its own.
func rawRunsc(id, rawRoot, rawID string) ([]string, string) {
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
		case strings.HasPrefix(g, "--network="):
			raw = append(raw, "--network=none")
		default:
			raw = append(raw, g)
		}
	}
	b, err := os.ReadFile(filepath.Join(root, "sandboxes", id, "bundle", "config.json"))
	if err != nil {
		benchexit.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		benchexit.Fatal(err)
	}
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		if m.Destination != "/.hutch/hutch-init" {
			mounts = append(mounts, m)
		}
	}
	spec.Mounts = mounts
	spec.Annotations = nil
	// A cgroup of its own, as hutch's sandboxes have: runsc sizes the
	// sandbox by its limits.
	spec.Linux.CgroupsPath = rawCgroup
	root := *spec.Root
	root.Readonly = false
	spec.Root = &root
	for i, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = ""
		}
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"echo", "hi"}
	bundle := filepath.Join(top, "raw-bundle")
	os.MkdirAll(bundle, 0o700)
	sb, _ := json.Marshal(&spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), sb, 0o600); err != nil {
		benchexit.Fatal(err)
	}
	return raw, bundle
}
