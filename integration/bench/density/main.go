// Command density measures what idle sandboxes cost on one host: it
// fills hutch's state with idle busybox sandboxes, step by step, and at each
// step measures host memory and processes per sandbox and the latency of
// create, exec, ls and rm, beside a raw runsc container of the same spec
// and flags in the same run. It writes its section of docs/benchmarks.md
// and the charts it references. Run it through `make bench` (as root); it
// stops filling early when host memory or its time runs short, and removes
// everything it created, also on failure or interrupt.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// bin holds the binaries; root is hutch's state root, a directory of top.
var bin, top, root string

func hutchCmd(args ...string) *exec.Cmd { return hutchCmdIn(bin, args...) }

// hutchCmdIn runs the hutch in directory dir.
func hutchCmdIn(dir string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(dir, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+root)
	return c
}

func hutch(args ...string) string { return hutchIn(bin, args...) }

func hutchIn(dir string, args ...string) string {
	out, err := hutchCmdIn(dir, args...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

func run(c *exec.Cmd) {
	if out, err := c.CombinedOutput(); err != nil {
		benchexit.Fatalf("%s: %v: %s", strings.Join(c.Args, " "), err, out)
	}
}

// firstOutput runs c and returns the time from just before its start to
// the first line of its stdout, which must be want; it waits for c.
func firstOutput(c *exec.Cmd, want string) time.Duration {
	out, err := c.StdoutPipe()
	if err != nil {
		benchexit.Fatal(err)
	}
	c.Stderr = os.Stderr
	start := time.Now()
	if err := c.Start(); err != nil {
		benchexit.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	d := time.Since(start)
	io.Copy(io.Discard, out) //nolint:errcheck // drained
	if werr := c.Wait(); err != nil || werr != nil || strings.TrimSpace(line) != want {
		benchexit.Fatalf("%s: printed %q (%v, %v), want %q", strings.Join(c.Args, " "), line, err, werr, want)
	}
	return d
}

// step is what was measured with n idle sandboxes alive. Memory is per
// idle sandbox, in bytes; latencies are in milliseconds.
type step struct {
	N int `json:"n"`

	PSS        int64   `json:"pss"`        // runsc sandbox, gofer and stubs
	RSS        int64   `json:"rss"`        // the same, counting shared pages in full
	HelperPSS  int64   `json:"helperPss"`  // hutch's own host helpers
	Cgroup     int64   `json:"cgroup"`     // charged to the sandbox's cgroup
	HostUsed   int64   `json:"hostUsed"`   // fall of the host's MemAvailable since the start
	Procs      float64 `json:"procs"`      // host processes
	Threads    float64 `json:"threads"`    // host threads
	RawPSS     int64   `json:"rawPss"`     // one idle raw runsc container
	RawCgroup  int64   `json:"rawCgroup"`  // its cgroup
	RawProcs   int     `json:"rawProcs"`   // its host processes
	RawThreads int     `json:"rawThreads"` // its host threads

	Create         float64 `json:"create"`         // hutch create, median
	CreateFirst    float64 `json:"createFirst"`    // create → first output of exec echo hi, median
	CreateNamed    float64 `json:"createNamed"`    // hutch create --name, median
	Rm             float64 `json:"rm"`             // hutch rm -f, median
	ExecID         float64 `json:"execId"`         // hutch exec ID true, median
	ExecIDP99      float64 `json:"execIdP99"`      // its p99
	ExecName       float64 `json:"execName"`       // hutch exec NAME true, median
	Ls             float64 `json:"ls"`             // hutch ls -q, median
	RawRun         float64 `json:"rawRun"`         // runsc run → first output, median
	RawExec        float64 `json:"rawExec"`        // runsc exec true, median
	RawExecP99     float64 `json:"rawExecP99"`     // its p99
	ExecSamples    int     `json:"execSamples"`    // samples behind the exec p99s
	FillPerHutchMs float64 `json:"fillPerHutchMs"` // mean hutch create while filling up to N
}

// helpers is what hutch's own host helpers cost per sandbox that needs
// them, by kind.
type helpers struct {
	N     int                  `json:"n"`
	Flags string               `json:"flags"`
	Kinds map[string]helperUse `json:"kinds"`
	Total helperUse            `json:"total"`
	// Binary is the program the helpers ran as: hutch-helper, or hutch
	// itself when there is no hutch-helper beside it.
	Binary string `json:"binary,omitempty"`
	// UsedForwarder is the port forwarder after one connection to each
	// published port (hutch-helper then has become hutch's forwarder).
	UsedForwarder *helperUse `json:"usedForwarder,omitempty"`
}

type helperUse struct {
	PSS     int64   `json:"pss"`
	Procs   float64 `json:"procs"`
	Threads float64 `json:"threads"`
}

// result is one run, written with -json and read back with -before.
type result struct {
	Date    string  `json:"date"`
	Samples int     `json:"samples"`
	Steps   []step  `json:"steps"`
	Helpers helpers `json:"helpers"`
	// HutchHelpers are the same helpers run by hutch itself (a copy of hutch
	// with no hutch-helper beside it), as before hutch-helper.
	HutchHelpers helpers `json:"hutchHelpers"`
	Stopped      string  `json:"stopped,omitempty"` // why filling stopped short
	Removed      struct {
		N        int     `json:"n"`
		MedianMs float64 `json:"medianMs"`
		TotalS   float64 `json:"totalS"`
		Left     string  `json:"left"`
	} `json:"removed"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(v []time.Duration) float64 { return quantile(v, 0.5) }

// quantile is the nearest-rank q-quantile of v, in milliseconds.
func quantile(v []time.Duration, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return ms(s[max(i, 0)])
}

func main() {
	flag.StringVar(&bin, "bin", "bin", "directory of the built hutch, hutch-init, runsc and images")
	out := flag.String("out", "docs/benchmarks.md", "benchmark document to update")
	chart := flag.String("chart", "", "PNG chart path prefix (default: density beside -out)")
	stepsFlag := flag.String("steps", "1,100,250,500", "numbers of live idle sandboxes to measure at, ascending")
	samples := flag.Int("samples", 10, "measured passes per step (exec: 3 per pass)")
	execSamples := flag.Int("exec-samples", 200, "exec samples per step behind the p99s, at least those of the passes")
	maxFill := flag.Duration("max-fill", 10*time.Minute, "stop filling after this long")
	minAvail := flag.Int64("min-avail-gib", 4, "stop filling when the host's MemAvailable falls below this many GiB")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file")
	before := flag.String("before", "", "JSON of an earlier run (-json) to compare with, e.g. before a change")
	change := flag.String("change", "", "what changed since the -before run, for the document")
	from := flag.String("from", "", "write the document and charts from this JSON (-json) instead of measuring")
	flag.Parse()
	var steps []int
	for _, f := range strings.Split(*stepsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || (len(steps) > 0 && n <= steps[len(steps)-1]) {
			benchexit.Fatalf("-steps %q: want ascending numbers ≥ 1", *stepsFlag)
		}
		steps = append(steps, n)
	}
	if *chart == "" {
		*chart = filepath.Join(filepath.Dir(*out), "density")
	}
	var res result
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			benchexit.Fatal(err)
		}
		if err := json.Unmarshal(b, &res); err != nil {
			benchexit.Fatalf("%s: %v", *from, err)
		}
	} else {
		if os.Geteuid() != 0 {
			benchexit.Fatalf("run as root")
		}
		res = measureAll(steps, *samples, *execSamples, *maxFill, *minAvail)
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			benchexit.Fatal(err)
		}
	}
	var prev *result
	if *before != "" {
		b, err := os.ReadFile(*before)
		if err != nil {
			benchexit.Fatal(err)
		}
		prev = new(result)
		if err := json.Unmarshal(b, prev); err != nil {
			benchexit.Fatalf("%s: %v", *before, err)
		}
	}
	charts, err := drawCharts(res, *chart)
	if err != nil {
		benchexit.Fatal(err)
	}
	for i := range charts {
		if rel, err := filepath.Rel(filepath.Dir(*out), charts[i]); err == nil {
			charts[i] = rel
		}
	}
	doc := report(res, prev, *change, charts)
	if err := benchdoc.WriteSection(*out, "density", doc); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Print(doc)
}

// measureAll fills hutch's state step by step, measures at each step and
// removes everything; it returns what it measured.
func measureAll(steps []int, samples, execSamples int, maxFill time.Duration, minAvail int64) result {
	var err error
	if bin, err = filepath.Abs(bin); err != nil {
		benchexit.Fatal(err)
	}
	if top, err = os.MkdirTemp("", "hutch-bench-density-"); err != nil {
		benchexit.Fatal(err)
	}
	root = filepath.Join(top, "state")
	rawRoot := filepath.Join(top, "raw-runsc")
	var live []string
	var res result
	var rawIdle, rawEcho rawSandbox
	cleaned := false
	cleanup := func() {
		if cleaned {
			return
		}
		cleaned = true
		rawIdle.remove()
		rawEcho.remove()
		unmountRaw(rawRoot)
		res.Removed.N = len(live)
		var rms []time.Duration
		start := time.Now()
		for _, id := range live {
			rms = append(rms, timed(func() { hutchCmd("rm", "-f", id).Run() })) //nolint:errcheck // checked below
		}
		res.Removed.TotalS = time.Since(start).Seconds()
		res.Removed.MedianMs = median(rms)
		// Whatever a failed create left.
		ids, _ := hutchCmd("ls", "-q").Output()
		for _, id := range strings.Fields(string(ids)) {
			hutchCmd("rm", "-f", id).Run() //nolint:errcheck // best effort
		}
		h, _ := scanHost(root, rawRoot)
		ents, _ := os.ReadDir(filepath.Join(root, "sandboxes"))
		res.Removed.Left = fmt.Sprintf("%d host processes, %d sandbox directories", h.runsc.procs+h.helpers.procs+h.raw.procs, len(ents))
		os.RemoveAll(top)
	}
	benchexit.AtExit(cleanup)
	defer cleanup()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { benchexit.Fatalf("%v", <-sig) }()

	avail0 := memAvailable()
	// The anchor: a named idle sandbox, exec's target, and the source of
	// raw runsc's spec and flags.
	anchor := strings.TrimSpace(hutch("create", "--image", "busybox", "--name", "density-anchor"))
	live = append(live, anchor)
	rawIdle = newRaw(anchor, rawRoot, "idle", "sleep", "1000000")
	rawEcho = newRaw(anchor, rawRoot, "echo", "echo", "hi")
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		benchexit.Fatal(err)
	}
	c := rawIdle.runsc("run", "--detach", "--bundle", rawIdle.bundle, rawIdle.id)
	c.Stdin, c.Stdout, c.Stderr = devnull, devnull, os.Stderr
	if err := c.Run(); err != nil {
		benchexit.Fatalf("raw runsc run --detach: %v", err)
	}

	fillStart := time.Now()
	for _, n := range steps {
		start, from := time.Now(), len(live)
		for len(live) < n && res.Stopped == "" {
			switch {
			case time.Since(fillStart) > maxFill:
				res.Stopped = fmt.Sprintf("filling stopped at %d sandboxes after %s (-max-fill)", len(live), maxFill)
			case memAvailable() < minAvail<<30:
				res.Stopped = fmt.Sprintf("filling stopped at %d sandboxes: host MemAvailable below %d GiB (-min-avail-gib)", len(live), minAvail)
			default:
				live = append(live, strings.TrimSpace(hutch("create", "--image", "busybox")))
			}
		}
		st := step{N: len(live)}
		if len(live) > from {
			st.FillPerHutchMs = ms(time.Since(start)) / float64(len(live)-from)
		}
		measure(&st, live, rawRoot, avail0, rawIdle, rawEcho, samples, execSamples)
		res.Steps = append(res.Steps, st)
		fmt.Fprintf(os.Stderr, "density: %+v\n", st)
		if res.Stopped != "" {
			break
		}
	}
	res.Helpers = measureHelpers(&live, rawRoot, 10, bin)
	if _, err := os.Stat(filepath.Join(bin, "hutch-helper")); err == nil {
		res.HutchHelpers = measureHelpers(&live, rawRoot, 10, hutchOnly(bin, filepath.Join(top, "hutch-only")))
	}
	res.Date = time.Now().UTC().Format("2006-01-02")
	res.Samples = samples
	cleanup()
	return res
}

// measure fills st at the current density: one scan of host memory and
// processes, then samples interleaved passes of the latencies.
func measure(st *step, live []string, rawRoot string, avail0 int64, rawIdle, rawEcho rawSandbox, samples, execSamples int) {
	n := int64(len(live))
	h, err := scanHost(root, rawRoot)
	if err != nil {
		benchexit.Fatal(err)
	}
	var cg int64
	for _, id := range live {
		m, err := cgroupMemory("/hutch/" + id)
		if err != nil {
			benchexit.Fatal(err)
		}
		cg += m
	}
	st.PSS, st.RSS, st.HelperPSS = h.runsc.pss/n, h.runsc.rss/n, h.helpers.pss/n
	st.Procs = float64(h.runsc.procs+h.helpers.procs) / float64(n)
	st.Threads = float64(h.runsc.threads+h.helpers.threads) / float64(n)
	st.Cgroup = cg / n
	st.HostUsed = (avail0 - memAvailable()) / n
	st.RawPSS, st.RawProcs, st.RawThreads = h.raw.pss, h.raw.procs, h.raw.threads
	if st.RawCgroup, err = cgroupMemory(rawIdle.cgroup); err != nil {
		benchexit.Fatal(err)
	}

	anchor := live[0]
	var create, first, named, rm, execID, execName, ls, rawRun, rawExec []time.Duration
	warm := -2
	if len(live) == 1 {
		warm = -5 // the first step also warms the host's caches
	}
	for i := warm; i < samples; i++ {
		var id string
		c := timed(func() { id = strings.TrimSpace(hutch("create", "--image", "busybox")) })
		f := c + firstOutput(hutchCmd("exec", id, "--", "echo", "hi"), "hi")
		r := timed(func() { hutch("rm", "-f", id) })
		nc := timed(func() { id = strings.TrimSpace(hutch("create", "--image", "busybox", "--name", "density-probe")) })
		r2 := timed(func() { hutch("rm", "-f", id) })
		rr := firstOutput(rawEcho.runsc("run", "--bundle", rawEcho.bundle, rawEcho.id), "hi")
		rawEcho.remove()
		var xs, rxs []time.Duration
		for j := 0; j < 3; j++ {
			xs = append(xs, timed(func() { hutch("exec", anchor, "--", "true") }))
			rxs = append(rxs, timed(func() { run(rawIdle.runsc("exec", rawIdle.id, "true")) }))
		}
		xn := timed(func() { hutch("exec", "density-anchor", "--", "true") })
		l := timed(func() { hutch("ls", "-q") })
		if i < 0 {
			continue // warm-up
		}
		create, first, named = append(create, c), append(first, f), append(named, nc)
		rm = append(rm, r, r2)
		execID, rawExec = append(execID, xs...), append(rawExec, rxs...)
		execName, ls, rawRun = append(execName, xn), append(ls, l), append(rawRun, rr)
	}
	// The p99s need more samples than the passes give: a batch of execs
	// alone, hutch and raw runsc in turns.
	for len(execID) < execSamples {
		execID = append(execID, timed(func() { hutch("exec", anchor, "--", "true") }))
		rawExec = append(rawExec, timed(func() { run(rawIdle.runsc("exec", rawIdle.id, "true")) }))
	}
	st.Create, st.CreateFirst, st.CreateNamed, st.Rm = median(create), median(first), median(named), median(rm)
	st.ExecID, st.ExecIDP99, st.ExecName, st.Ls = median(execID), quantile(execID, 0.99), median(execName), median(ls)
	st.RawRun, st.RawExec, st.RawExecP99 = median(rawRun), median(rawExec), quantile(rawExec, 0.99)
	st.ExecSamples = len(execID)
}

// hutchOnly makes dir a copy of the bin directory without hutch-helper: a
// copy of hutch (which looks for hutch-helper beside its own file) and links
// to the rest. hutch there runs its helpers itself.
func hutchOnly(bin, dir string) string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		benchexit.Fatal(err)
	}
	ents, err := os.ReadDir(bin)
	if err != nil {
		benchexit.Fatal(err)
	}
	for _, e := range ents {
		src, dst := filepath.Join(bin, e.Name()), filepath.Join(dir, e.Name())
		switch e.Name() {
		case "hutch-helper":
		case "hutch":
			b, err := os.ReadFile(src)
			if err == nil {
				err = os.WriteFile(dst, b, 0o755)
			}
			if err != nil {
				benchexit.Fatal(err)
			}
		default:
			if err := os.Symlink(src, dst); err != nil {
				benchexit.Fatal(err)
			}
		}
	}
	return dir
}

// measureHelpers creates k sandboxes that need each of hutch's helpers (a
// DNS resolver for network open, a lifetime watchdog, a port forwarder)
// with the hutch in dir and returns what those helpers hold per sandbox,
// and what a forwarder holds once it has served a connection.
func measureHelpers(live *[]string, rawRoot string, k int, dir string) helpers {
	flags := []string{"--net", "open", "--timeout", "1h", "-p", "127.0.0.1:0:80"}
	before, err := scanHost(root, rawRoot)
	if err != nil {
		benchexit.Fatal(err)
	}
	var ids []string
	for range k {
		ids = append(ids, strings.TrimSpace(hutchIn(dir, append([]string{"create", "--image", "busybox"}, flags...)...)))
		*live = append(*live, ids[len(ids)-1])
	}
	time.Sleep(time.Second) // the helpers settle
	after, err := scanHost(root, rawRoot)
	if err != nil {
		benchexit.Fatal(err)
	}
	per := func(a, b usage) helperUse {
		return helperUse{PSS: (a.pss - b.pss) / int64(k), Procs: float64(a.procs-b.procs) / float64(k), Threads: float64(a.threads-b.threads) / float64(k)}
	}
	h := helpers{N: k, Flags: strings.Join(flags, " "), Kinds: map[string]helperUse{}, Total: per(after.helpers, before.helpers), Binary: "hutch"}
	if _, err := os.Stat(filepath.Join(dir, "hutch-helper")); err == nil {
		h.Binary = "hutch-helper"
	}
	for name, u := range after.kinds {
		h.Kinds[name] = per(u, before.kinds[name])
	}
	if h.Binary == "hutch" {
		return h
	}
	// One connection to each published port: nothing listens on port
	// 80 in the sandbox, so the forwarder accepts it and closes it.
	for _, id := range ids {
		var insp struct {
			Ports []struct {
				HostPort int `json:"hostPort"`
			} `json:"ports"`
		}
		if err := json.Unmarshal([]byte(hutchIn(dir, "inspect", id)), &insp); err != nil || len(insp.Ports) == 0 {
			benchexit.Fatalf("hutch inspect %s: no published port (%v)", id, err)
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", insp.Ports[0].HostPort), 5*time.Second)
		if err != nil {
			benchexit.Fatalf("connect to the published port of %s: %v", id, err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // TCP supports deadlines
		io.Copy(io.Discard, c)                              //nolint:errcheck // until the forwarder closes it
		c.Close()
	}
	time.Sleep(time.Second)
	used, err := scanHost(root, rawRoot)
	if err != nil {
		benchexit.Fatal(err)
	}
	u := per(used.kinds["port-forward"], before.kinds["port-forward"])
	h.UsedForwarder = &u
	return h
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func msf(v float64) string { return fmt.Sprintf("%.1f ms", v) }

// report is the markdown section.
func report(res result, prev *result, change string, charts []string) string {
	runscVersion := "runsc ?"
	if v, err := exec.Command(filepath.Join(bin, "runsc"), "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	var w strings.Builder
	fmt.Fprintf(&w, "### Density: idle sandboxes on one host\n\n")
	fmt.Fprintf(&w, "`go run ./integration/bench/density -bin bin -out docs/benchmarks.md` (as `make bench` runs it), %s, %d CPUs, %.0f GiB, %s, %s. "+
		"The program fills hutch's state with idle `hutch create --image busybox` sandboxes (default limits and network `none`: no hutch helper process) and, at each number *N* of live ones, measures "+
		"host memory per sandbox (one scan of `/proc/*/smaps_rollup`: PSS and RSS of runsc's sandbox, gofer and stub processes; hutch's own helpers; the memory charged to each sandbox's cgroup; the host's MemAvailable fallen since the start, divided by N, which other load on the shared machine also moves), "+
		"host processes and threads per sandbox, and then %d interleaved passes of: `hutch create` (to its ID; then `hutch exec ID -- echo hi` to its first output: create → first output), `hutch rm -f`, `hutch create --name`, "+
		"`hutch exec ID -- true` (3 per pass), `hutch exec NAME -- true`, `hutch ls -q`; beside raw runsc with hutch's spec and runsc flags (no network, a cgroup of the same limits): `runsc run` of `echo hi` to its first output, and `runsc exec` of `true` (3 per pass) into one idle raw container (`sleep`) alive throughout, whose memory is measured the same way. Medians unless marked; the machine is shared: compare columns, not runs.\n\n",
		res.Date, runtime.NumCPU(), float64(totalMem())/(1<<30), runtime.GOOS+"/"+runtime.GOARCH, runscVersion, res.Samples)
	fmt.Fprintf(&w, "| live N | PSS / sandbox | RSS / sandbox | cgroup / sandbox | host used / sandbox | hutch helpers PSS / sandbox | host procs / threads per sandbox | raw runsc idle: PSS, cgroup, procs / threads |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range res.Steps {
		fmt.Fprintf(&w, "| %d | %s | %s | %s | %s | %s | %.1f / %.1f | %s, %s, %d / %d |\n", s.N, mib(s.PSS), mib(s.RSS), mib(s.Cgroup), mib(s.HostUsed), mib(s.HelperPSS), s.Procs, s.Threads, mib(s.RawPSS), mib(s.RawCgroup), s.RawProcs, s.RawThreads)
	}
	fmt.Fprintf(&w, "\n| live N | hutch create | create → first output | runsc run → first output | create --name | rm -f | exec ID | exec ID p99 | runsc exec | runsc exec p99 | exec NAME | ls -q |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range res.Steps {
		fmt.Fprintf(&w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.N, msf(s.Create), msf(s.CreateFirst), msf(s.RawRun), msf(s.CreateNamed), msf(s.Rm), msf(s.ExecID), msf(s.ExecIDP99), msf(s.RawExec), msf(s.RawExecP99), msf(s.ExecName), msf(s.Ls))
	}
	if len(res.Steps) > 0 {
		a, b := res.Steps[0], res.Steps[len(res.Steps)-1]
		fmt.Fprintf(&w, "\nFrom %d to %d live sandboxes: create → first output %.2fx (raw runsc run %.2fx), exec median %.2fx and p99 %.2fx (raw runsc exec %.2fx and %.2fx), `hutch ls -q` %.2fx; p99s are of %d samples. "+
			"The machine's other load moves every column, so hutch against raw runsc in the same step is the steadier measure: create → first output ÷ runsc run → first output is %.2f at %d and %.2f at %d live, exec ÷ runsc exec (medians) %.2f and %.2f. Filling ran at %s per create on average.",
			a.N, b.N, b.CreateFirst/a.CreateFirst, b.RawRun/a.RawRun, b.ExecID/a.ExecID, b.ExecIDP99/a.ExecIDP99, b.RawExec/a.RawExec, b.RawExecP99/a.RawExecP99, b.Ls/a.Ls, b.ExecSamples,
			a.CreateFirst/a.RawRun, a.N, b.CreateFirst/b.RawRun, b.N, a.ExecID/a.RawExec, b.ExecID/b.RawExec, msf(b.FillPerHutchMs))
		if res.Stopped != "" {
			fmt.Fprintf(&w, " The %s.", res.Stopped)
		}
		fmt.Fprintf(&w, " Removing all %d: %s median `hutch rm -f`, %.1f s in all; left after: %s.\n", res.Removed.N, msf(res.Removed.MedianMs), res.Removed.TotalS, res.Removed.Left)
	}
	if len(res.Steps) > 0 {
		b, a := res.Steps[len(res.Steps)-1], res.Steps[0]
		fmt.Fprintf(&w, "\nWhere the memory goes: with %d live, an idle hutch sandbox holds %s PSS (%s charged to its cgroup) against an idle raw runsc container's %s (%s): "+
			"the memory is gVisor's own (its sentry, gofer and systrap stub processes); hutch runs its in-sandbox agent where the raw container runs `sleep`, and no host process of its own. "+
			"PSS per sandbox falls from %s at %d live as the runsc binary's pages are shared among more processes. At the cgroup figure, 500 idle sandboxes hold about %.1f GiB of this host's %.0f GiB. "+
			"Where the time goes as N grows: `hutch create`, `hutch exec ID` and `hutch rm` read only their own sandbox's record, `hutch exec NAME` and `create --name` one link of the name index besides; `hutch ls` reads every record. Only when runsc cannot account for a sandbox's processes (a failed `runsc delete`, an unfinished create) does a removal read the command line of every host process (about %.0f per sandbox) to find them.\n",
			b.N, mib(b.PSS), mib(b.Cgroup), mib(b.RawPSS), mib(b.RawCgroup), mib(a.PSS), a.N, float64(b.Cgroup)*500/(1<<30), float64(totalMem())/(1<<30), b.Procs)
	}
	if h := res.Helpers; h.N > 0 {
		fmt.Fprintf(&w, "\nhutch's own host helpers run only for sandboxes that need them: a DNS resolver for network `open` or `allow`, a lifetime watchdog for `--timeout`, a port forwarder for `-p`; the default sandbox above has none. "+
			"Per sandbox created with `%s` (%d of them), what each helper holds", h.Flags, h.N)
		o := res.HutchHelpers
		if o.N > 0 {
			fmt.Fprintf(&w, " when %s runs it and, in the same run, when hutch itself does (a copy of hutch with no hutch-helper beside it, as hutch ran them before hutch-helper)", h.Binary)
		}
		fmt.Fprintf(&w, ":\n\n| helper | %s: PSS | processes / threads |", h.Binary)
		if o.N > 0 {
			fmt.Fprintf(&w, " %s: PSS | processes / threads |", o.Binary)
		}
		fmt.Fprintf(&w, "\n| --- | --- | --- |")
		if o.N > 0 {
			fmt.Fprintf(&w, " --- | --- |")
		}
		row := func(name string, u helperUse, ou helperUse, ok bool) {
			fmt.Fprintf(&w, "\n| %s | %s | %.1f / %.1f |", name, mib(u.PSS), u.Procs, u.Threads)
			if o.N > 0 && ok {
				fmt.Fprintf(&w, " %s | %.1f / %.1f |", mib(ou.PSS), ou.Procs, ou.Threads)
			} else if o.N > 0 {
				fmt.Fprintf(&w, " | |")
			}
		}
		for _, k := range helperKinds {
			if u, ok := h.Kinds[k]; ok {
				ou, ook := o.Kinds[k]
				row("`"+k+"`", u, ou, ook)
			}
		}
		row("all", h.Total, o.Total, true)
		fmt.Fprintf(&w, "\n")
		if len(res.Steps) > 0 {
			p := res.Steps[len(res.Steps)-1].Procs
			fmt.Fprintf(&w, "\nHost processes per sandbox: %.0f (runsc's) with none of these, as above; one more for each helper it needs: %.0f with network `open` or `allow`, %.0f with all three.\n", p, p+1, p+3)
		}
		if u := h.UsedForwarder; u != nil {
			fmt.Fprintf(&w, "\nhutch-helper's watchdog and forwarder wait and then exec hutch (the same process): the watchdog at the deadline, the forwarder at the first connection to a published port. "+
				"After one connection to each sandbox's published port, a forwarder holds %s PSS (%.1f processes / %.1f threads): a published port that is used costs what it did before; one that is not, and every watchdog until its deadline, costs only hutch-helper.\n",
				mib(u.PSS), u.Procs, u.Threads)
		}
	}
	if prev != nil {
		if change != "" {
			change = ": " + change
		}
		fmt.Fprintf(&w, "\nBefore → after%s (the same program, the earlier run of %s with the previous hutch):\n\n", change, prev.Date)
		fmt.Fprintf(&w, "| live N | create --name | exec NAME | exec NAME ÷ runsc exec | ls -q | create → first output | exec ID | runsc exec (load yardstick) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, s := range res.Steps {
			for _, p := range prev.Steps {
				if p.N == s.N {
					fmt.Fprintf(&w, "| %d | %s → %s | %s → %s | %.2f → %.2f | %s → %s | %s → %s | %s → %s | %s → %s |\n", s.N,
						msf(p.CreateNamed), msf(s.CreateNamed), msf(p.ExecName), msf(s.ExecName), p.ExecName/p.RawExec, s.ExecName/s.RawExec,
						msf(p.Ls), msf(s.Ls), msf(p.CreateFirst), msf(s.CreateFirst), msf(p.ExecID), msf(s.ExecID), msf(p.RawExec), msf(s.RawExec))
				}
			}
		}
	}
	for _, c := range charts {
		fmt.Fprintf(&w, "\n![%s](%s)\n", strings.TrimSuffix(filepath.Base(c), ".png"), c)
	}
	return w.String()
}

// totalMem is the host's MemTotal in bytes.
func totalMem() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	n, _ := kBField(b, "MemTotal:")
	return n
}
