// Command neighbours measures what a sandbox writing and sending as fast
// as it can does to a neighbour sandbox on the same host: the round trip
// of `hutch exec ID true`, a 64 KiB file written and read back inside the
// neighbour, and `hutch cp` of a 64 KiB file in and out, beside `runsc
// exec` into the same neighbour, with the host idle, under a flood of
// disk and network from another sandbox with `--net-rate`, and under the
// same flood without it. It writes its own section of docs/benchmarks.md.
// Run it through `make bench` (as root).
//
// The flood's network traffic goes only to a sink in a network namespace
// the program makes (a veth pair on a private /30), which the flooding
// sandbox's allow rule names; nothing leaves the host.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

// fileSize is the size of the file of the file measurements.
const fileSize = 64 << 10

// sinkPort is the port of the network sink in the bench's namespace.
const sinkPort = 9000

// flood runs in the flooding sandbox: two writers, each writing a 256 MiB
// file as fast as it can, synced (else a file removed before its
// writeback never reaches the disk), and again, one on the sandbox's root
// filesystem and one on a named volume, and one sender of zeros to the
// sink, again on every end of its connection.
const flood = `w() { while :; do dd if=/dev/zero of="$1" bs=1M count=256 conv=fsync 2>/dev/null; rm -f "$1"; done; }
w /flood.bin & w /vol/flood.bin &
while :; do nc "$0" "$1" </dev/zero; done`

// fileOp writes a 64 KiB file (synced) and reads it back, inside the
// neighbour.
const fileOp = `dd if=/dev/zero of=/bench.f bs=65536 count=1 conv=fsync 2>/dev/null && cat /bench.f >/dev/null && rm /bench.f`

type config struct {
	bin, out  string
	n, warmup int
	rate      string
}

// metric is one way of measuring the neighbour, and its samples in
// seconds under each condition.
type metric struct {
	name string
	run  func() error
	got  map[string][]float64
}

// condition is a state of the host the neighbour is measured in.
type condition struct {
	name string
	// start starts what the condition runs beside the neighbour; stop
	// ends it. nil: nothing.
	start, stop func()
	// sent and written are what the flood delivered to the sink and what
	// the host's disk wrote while the neighbour was measured, per second.
	sent, written float64
}

func main() {
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory holding hutch, hutch-init, runsc and images/busybox.tar")
	flag.StringVar(&c.out, "out", "", "markdown file whose neighbours section is (re)written; empty: stdout only")
	flag.IntVar(&c.n, "n", 40, "measured rounds per condition")
	flag.IntVar(&c.warmup, "warmup", 3, "untimed rounds per condition first")
	flag.StringVar(&c.rate, "rate", "10mbit", "--net-rate of the limited flood")
	flag.Parse()
	if flag.NArg() != 0 || c.n < 1 || c.warmup < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		benchexit.Fatal("neighbours: run as root (network namespaces, --net-rate)")
	}
	command := invocation()
	started := time.Now()
	loadStart := loadAverage()
	var err error
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		benchexit.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-neighbours-")
	if err != nil {
		benchexit.Fatal(err)
	}
	root := filepath.Join(tmp, "hutch")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") {
			env = append(env, kv)
		}
	}
	env = append(env, "HUTCH_ROOT="+root)
	hutch := func(args ...string) string {
		cmd := exec.Command(filepath.Join(c.bin, "hutch"), args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			benchexit.Fatalf("hutch %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out))
	}
	w := newWorld()
	cleanup := func() {
		cmd := exec.Command(filepath.Join(c.bin, "hutch"), "ls", "-q")
		cmd.Env = env
		out, _ := cmd.Output()
		for _, id := range strings.Fields(string(out)) {
			rm := exec.Command(filepath.Join(c.bin, "hutch"), "rm", "-f", id)
			rm.Env = env
			rm.Run() //nolint:errcheck // best effort on the way out
		}
		rm := exec.Command(filepath.Join(c.bin, "hutch"), "volume", "rm", "flood")
		rm.Env = env
		rm.Run() //nolint:errcheck // best effort on the way out
		w.close()
		os.RemoveAll(tmp)
	}
	benchexit.AtExit(cleanup)
	w.setUp()

	// The sink counts what arrives as it arrives.
	var received atomic.Int64
	go func() {
		for {
			conn, err := w.sink.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 256<<10)
				for {
					n, err := conn.Read(buf)
					received.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()

	neighbour := hutch("create", "--image", "busybox", "--net", "none")
	var rec struct {
		Pid int `json:"pid"`
	}
	// The host PID is in the engine's record only.
	if err := json.Unmarshal([]byte(hutch("inspect", "--format", "debug", neighbour)), &rec); err != nil {
		benchexit.Fatalf("hutch inspect %s: %v", neighbour, err)
	}
	globals, err := runscGlobals(rec.Pid)
	if err != nil {
		benchexit.Fatal(err)
	}
	hutch("volume", "create", "flood")
	in, back := filepath.Join(tmp, "in.bin"), filepath.Join(tmp, "back.bin")
	data := make([]byte, fileSize)
	rand.Read(data) //nolint:errcheck // never fails
	if err := os.WriteFile(in, data, 0o644); err != nil {
		benchexit.Fatal(err)
	}

	run := func(name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil
	}
	hutchBin, runsc := filepath.Join(c.bin, "hutch"), filepath.Join(c.bin, "runsc")
	runscExec := func(args ...string) []string {
		return append(append(append([]string{}, globals...), "exec", neighbour), args...)
	}
	metrics := []*metric{
		{name: "`hutch exec ID true`", run: func() error { return run(hutchBin, "exec", neighbour, "--", "true") }},
		{name: "`hutch exec ID sh -c` 64 KiB file written (fsync) and read", run: func() error {
			return run(hutchBin, "exec", neighbour, "--", "sh", "-c", fileOp)
		}},
		{name: "`hutch cp` of a 64 KiB file in, then out", run: func() error {
			if err := run(hutchBin, "cp", in, neighbour+":/bench.in"); err != nil {
				return err
			}
			os.Remove(back)
			if err := run(hutchBin, "cp", neighbour+":/bench.in", back); err != nil {
				return err
			}
			if b, err := os.ReadFile(back); err != nil || !bytes.Equal(b, data) {
				return fmt.Errorf("hutch cp: the file copied back differs (%v)", err)
			}
			return nil
		}},
		{name: "`runsc exec ID true`", run: func() error { return run(runsc, runscExec("true")...) }},
		{name: "`runsc exec ID sh -c` 64 KiB file written (fsync) and read", run: func() error {
			return run(runsc, runscExec("sh", "-c", fileOp)...)
		}},
	}
	for _, m := range metrics {
		m.got = map[string][]float64{}
	}

	// A flooder of the condition: a new sandbox each time, removed at
	// its end, so that nothing of its flood outlives it.
	var flooder string
	startFlood := func(netArgs ...string) func() {
		return func() {
			args := append([]string{"create", "--image", "busybox", "--net", "allow", "--allow", w.sinkAddr(), "-v", "flood:/vol"}, netArgs...)
			flooder = hutch(args...)
			hutch("exec", "-d", flooder, "--", "sh", "-c", flood, w.sinkIP, strconv.Itoa(sinkPort))
		}
	}
	stopFlood := func() {
		hutch("rm", "-f", flooder)
		flooder = ""
	}
	conds := []*condition{
		{name: "idle"},
		{name: "flood, `--net-rate " + c.rate + "`", start: startFlood("--net-rate", c.rate), stop: stopFlood},
		{name: "flood, no limit", start: startFlood(), stop: stopFlood},
	}
	dev, sched := stateDevice(tmp)
	for _, cond := range conds {
		fmt.Fprintf(os.Stderr, "bench: %s\n", cond.name)
		if cond.start != nil {
			cond.start()
		}
		if err := rounds(c.warmup, metrics, ""); err != nil {
			benchexit.Fatalf("%s (warm-up): %v", cond.name, err)
		}
		r0, d0, t0 := received.Load(), sectorsWritten(dev), time.Now()
		if err := rounds(c.n, metrics, cond.name); err != nil {
			benchexit.Fatalf("%s: %v", cond.name, err)
		}
		secs := time.Since(t0).Seconds()
		cond.sent = float64(received.Load()-r0) * 8 / secs
		cond.written = float64((sectorsWritten(dev)-d0)*512) / secs
		if cond.stop != nil {
			cond.stop()
		}
	}
	elapsed := time.Since(started)
	runscVersion := "runsc ?"
	if v, err := exec.Command(runsc, "--version").Output(); err == nil {
		runscVersion = strings.SplitN(strings.TrimSpace(string(v)), "\n", 2)[0]
	}
	loadEnd := loadAverage()
	cleanup()

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## Neighbours: a sandbox flooding disk and network beside another\n\n")
	p("Produced by %s on %s, as root, in %s. Machine: %d CPUs, %s; %s; cgroup %s; the state root's disk %s, I/O scheduler %s. "+
		"Load average (1 min) at start %s, at end %s. The machine is shared: compare cells of one run, not runs.\n\n",
		command, started.UTC().Format("2006-01-02 15:04 UTC"), elapsed.Round(time.Second),
		runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runscVersion, cgroupVersion(), dev, sched, loadStart, loadEnd)
	p("The neighbour is a busybox sandbox (`--net none`, hutch's default limits). Each row runs in it from fork to exit of the host command, "+
		"the rows interleaved (the order rotating each round), %d untimed rounds then %d timed ones per condition; p50 and p95 by nearest rank, "+
		"and in brackets each as a multiple of the same row's idle value. "+
		"*`runsc exec`*: runsc with the neighbour's own global flags, into the same sandbox. "+
		"*Flood*: a second busybox sandbox (hutch's default limits, `--cpus 2`, `--memory 2g`) runs two `dd` loops writing 256 MiB files of zeros (`conv=fsync`), "+
		"one on its root filesystem (gVisor's overlay, backed by a file under the state root), one on a named volume, and `nc` sending zeros "+
		"to a sink on a veth in a network namespace this program makes (`--net allow --allow %s`), nothing else; "+
		"first with `--net-rate %s`, then the same without it, a new flooder each time.\n\n", c.warmup, c.n, w.sinkAddr(), c.rate)
	p("| row |")
	for _, cond := range conds {
		p(" %s: p50 | p95 |", cond.name)
	}
	p("\n|---|")
	for range conds {
		p("---:|---:|")
	}
	p("\n")
	over := map[string][]string{}
	for _, m := range metrics {
		p("| %s |", m.name)
		idle := conds[0].name
		i50, i95 := quantile(sorted(m.got[idle]), 0.5), quantile(sorted(m.got[idle]), 0.95)
		for k, cond := range conds {
			v := sorted(m.got[cond.name])
			q50, q95 := quantile(v, 0.5), quantile(v, 0.95)
			if k == 0 {
				p(" %s | %s |", ms(q50), ms(q95))
				continue
			}
			p(" %s (%.2f×) | %s (%.2f×) |", ms(q50), q50/i50, ms(q95), q95/i95)
			if q50/i50 > 1.5 || q95/i95 > 1.5 {
				over[cond.name] = append(over[cond.name], m.name)
			}
		}
		p("\n")
	}
	p("\nWhat the flooder delivered while the neighbour was measured: ")
	for _, cond := range conds[1:] {
		p("%s: %.0f Mbit/s to the sink, the host's disk writing %.0f MiB/s; ", cond.name, cond.sent/1e6, cond.written/(1<<20))
	}
	p("idle: the disk writing %.0f MiB/s (other work of the machine).\n\n", conds[0].written/(1<<20))
	for _, cond := range conds[1:] {
		if len(over[cond.name]) == 0 {
			p("Under %s every row stays within 1.5× of idle at p50 and p95. ", cond.name)
		} else {
			p("Under %s, past 1.5× of idle at p50 or p95: %s. ", cond.name, strings.Join(over[cond.name], ", "))
		}
	}
	p("\n\n")
	p("Disk isolation is what this host gives: on cgroup v1 with %s, blkio weights need BFQ (or CFQ) and v1 throttling does not cover "+
		"buffered writeback, which is how both the sentry's overlay file and a volume's gofer write, so hutch sets no disk I/O limit; "+
		"the flooder's writes share the page cache and the device with the neighbour's. `--net-rate` bounds what the flooder sends, and so the CPU "+
		"its network stack and the host's forwarding take; the flooder's `dd` and `nc` still use its CPU quota.\n", sched)
	section := b.String()
	fmt.Print(section)
	if c.out == "" {
		return
	}
	if err := benchdoc.WriteSection(c.out, "neighbours", section); err != nil {
		benchexit.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", c.out)
}

// rounds runs n rounds of every metric, the order rotating each round,
// and records the times under cond unless it is "".
func rounds(n int, metrics []*metric, cond string) error {
	for i := 0; i < n; i++ {
		for j := range metrics {
			m := metrics[(i+j)%len(metrics)]
			t0 := time.Now()
			if err := m.run(); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			if cond != "" {
				m.got[cond] = append(m.got[cond], time.Since(t0).Seconds())
			}
		}
	}
	return nil
}

// world is the bench's network namespace, holding the sink, and its veth
// pair to the host: a private /30, nothing routed beyond it.
type world struct {
	ns, hostIf       string
	hostIP, sinkIP   string
	sink             net.Listener
	forward, created bool
	oldForward       []byte
}

func newWorld() *world {
	n := os.Getpid()%200 + 20
	return &world{
		ns: fmt.Sprintf("hutchbench-%d", n), hostIf: fmt.Sprintf("hutchbn%d", n),
		hostIP: fmt.Sprintf("10.95.%d.1", n), sinkIP: fmt.Sprintf("10.95.%d.2", n),
	}
}

func (w *world) sinkAddr() string { return w.sinkIP + ":" + strconv.Itoa(sinkPort) }

func ip(args ...string) {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		benchexit.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (w *world) setUp() {
	w.created = true
	ip("netns", "add", w.ns)
	ip("link", "add", w.hostIf, "type", "veth", "peer", "name", "eth0", "netns", w.ns)
	ip("addr", "add", w.hostIP+"/30", "dev", w.hostIf)
	ip("link", "set", w.hostIf, "up")
	ip("-n", w.ns, "addr", "add", w.sinkIP+"/30", "dev", "eth0")
	ip("-n", w.ns, "link", "set", "eth0", "up")
	ip("-n", w.ns, "link", "set", "lo", "up")
	// Replies to the sandbox's address go back the way they came.
	ip("-n", w.ns, "route", "add", "default", "via", w.hostIP)
	// The sandbox's packets are forwarded by the host to the veth.
	var err error
	if w.oldForward, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil {
		benchexit.Fatal(err)
	}
	if strings.TrimSpace(string(w.oldForward)) != "1" {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			benchexit.Fatal(err)
		}
		w.forward = true
	}
	if w.sink, err = listenIn(w.ns, net.JoinHostPort(w.sinkIP, strconv.Itoa(sinkPort))); err != nil {
		benchexit.Fatal(err)
	}
}

func (w *world) close() {
	if w.sink != nil {
		w.sink.Close()
	}
	if !w.created {
		return
	}
	exec.Command("ip", "link", "del", w.hostIf).Run() //nolint:errcheck // gone with the namespace otherwise
	exec.Command("ip", "netns", "del", w.ns).Run()    //nolint:errcheck // best effort on the way out
	if w.forward {
		os.WriteFile("/proc/sys/net/ipv4/ip_forward", w.oldForward, 0o644) //nolint:errcheck // best effort on the way out
	}
	w.created = false
}

// listenIn listens on addr (TCP) inside network namespace name.
func listenIn(name, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	target, err := netns.GetFromName(name)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	defer netns.Set(orig) //nolint:errcheck // the thread is locked and returns to orig
	return net.Listen("tcp4", addr)
}

// stateDevice is the block device holding dir and its disk's I/O
// scheduler.
func stateDevice(dir string) (dev, sched string) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "?", "?"
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return "?", "?"
	}
	real := filepath.Join("/sys/dev/block", link)
	dev = filepath.Base(real)
	q := filepath.Join(real, "queue", "scheduler")
	if _, err := os.Stat(q); err != nil {
		// A partition's scheduler is its disk's.
		q = filepath.Join(filepath.Dir(real), "queue", "scheduler")
	}
	b, err := os.ReadFile(q)
	if err != nil {
		return dev, "?"
	}
	sched = strings.TrimSpace(string(b))
	if i, j := strings.Index(sched, "["), strings.Index(sched, "]"); i >= 0 && j > i {
		sched = sched[i+1 : j]
	}
	return dev, sched
}

// sectorsWritten is device dev's sectors written since boot.
func sectorsWritten(dev string) int64 {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 9 && f[2] == dev {
			n, _ := strconv.ParseInt(f[9], 10, 64)
			return n
		}
	}
	return 0
}

// cgroupVersion is v2 on a unified hierarchy, else v1 (hybrid included).
func cgroupVersion() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "v2"
	}
	return "v1"
}

// runscGlobals reads the global flags that the gVisor sandbox process pid
// was started with: its arguments before the "boot" subcommand.
func runscGlobals(pid int) ([]string, error) {
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")
	for i, a := range args {
		if a == "boot" {
			return args[1:i], nil
		}
	}
	return nil, fmt.Errorf("process %d is not a runsc sandbox: %q", pid, args)
}

func sorted(v []float64) []float64 {
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	return v
}

// quantile by nearest rank of sorted samples.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func ms(s float64) string {
	v := s * 1000
	if v < 10 {
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// invocation is the command line of this run as the report shows it:
// `make bench` when it was given just the Makefile's flags (the
// checkout's bin and docs/benchmarks.md).
func invocation() string {
	args := []string{"go", "run", "./integration/bench/neighbours"}
	makeFlags := true
	flag.Visit(func(f *flag.Flag) {
		v := f.Value.String()
		switch f.Name {
		case "bin":
			if wd, err := os.Getwd(); err == nil {
				if rel, err := filepath.Rel(wd, v); err == nil && !strings.HasPrefix(rel, "..") {
					v = rel
				}
			}
			makeFlags = makeFlags && v == "bin"
		case "out":
			makeFlags = makeFlags && filepath.Clean(v) == "docs/benchmarks.md"
		default:
			makeFlags = false
		}
		args = append(args, "-"+f.Name, v)
	})
	if makeFlags {
		return "`make bench` (`" + strings.Join(args, " ") + "`)"
	}
	return "`" + strings.Join(args, " ") + "`"
}
