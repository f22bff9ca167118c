package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// aim is the target ratio of hutch's median to raw runsc's for latencies.
const aim = 1.3

// stats summarizes samples (seconds, bytes, ...).
type stats struct {
	n                int
	median, p90, min float64
}

func summarize(v []float64) stats {
	if len(v) == 0 {
		return stats{}
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	// p90 by nearest rank.
	p90 := s[int(math.Ceil(0.9*float64(n)))-1]
	return stats{n: n, median: med, p90: p90, min: s[0]}
}

func firstByte(r result) time.Duration { return r.firstByte }
func exitTime(r result) time.Duration  { return r.exit }

// seconds extracts a duration from each result, in seconds.
func seconds(rs []result, f func(result) time.Duration) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r).Seconds()
	}
	return out
}

func values(rs []result, f func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func memValues(ms []hostMemory, f func(hostMemory) float64) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = f(m)
	}
	return out
}

// row is one hutch-against-runsc comparison.
type row struct {
	hutch, raw stats
}

func (r row) ratio() float64 { return r.hutch.median / r.raw.median }

type streamResult struct {
	hutchHWM, hutchMaxRSS, rawMaxRSS stats
	hutchRate, rawRate               stats
	hutchTime, rawTime               stats
	hutchCPU, rawCPU                 stats
}

type idleResult struct {
	hutchPSS, rawPSS     stats
	hutchRSS, rawRSS     stats
	hutchProcs, rawProcs stats
}

// report is everything one run measured. Durations are in seconds, sizes
// in bytes.
type report struct {
	cfg     config
	started time.Time
	elapsed time.Duration

	nproc                                   int
	kernel, runscVersion, hutchVersion, cpu string
	memTotal                                int64
	loadStart, loadEnd                      string

	targetGlobals []string
	resources     *specs.LinuxResources
	mounts        []string
	hutchInit     []string

	// The latencies the aim applies to.
	run, execTrue, execEcho row

	// The steps of hutch run and fixed costs.
	runCycle, create, firstExec, rm row
	cliFloor                        stats
	// rawRunDeletes counts the runs after which `runsc run` had left
	// state for `runsc delete` to remove.
	rawRunDeletes int

	// Inside hutch create and rm, phase by phase.
	createPhases, rmPhases *phaseSeries
	shimOverhead           float64

	stream streamResult
	// streamDD is the same stream written 1 MiB at a time (zero if
	// the size is not a multiple of it).
	streamDD streamResult
	idle     idleResult
}

// aimRow is a latency the aim applies to.
type aimRow struct {
	label, short string
	row
}

func (r *report) aimRows() []aimRow {
	return []aimRow{
		{"create → first output (`run`, `echo hi`)", "create → first output", r.run},
		{"exec `true` → exit", "exec `true`", r.execTrue},
		{"exec `echo hi` → first output", "exec `echo hi` → first output", r.execEcho},
	}
}

func ms(s float64) string {
	v := s * 1000
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1f s", s)
	case v < 10 && v > -10:
		return fmt.Sprintf("%.2f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}

func signedMs(s float64) string {
	if s >= 0 {
		return "+" + ms(s)
	}
	return "−" + ms(-s)
}

func laterOrSooner(s float64) string {
	if s >= 0 {
		return ms(s) + " later"
	}
	return ms(-s) + " sooner"
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

func mark(ratio float64) string {
	if ratio <= aim {
		return "✅ pass"
	}
	return "❌ miss"
}

// render writes the report as the lifecycle section of the markdown file.
func render(r *report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }

	p("## Sandbox lifecycle: hutch against raw runsc\n\n")
	p("Produced by %s on %s, as root, in %s. The two sides run interleaved "+
		"(hutch first in even pairs, runsc first in odd ones) after %d untimed warm-up runs each; "+
		"create/run benchmarks take %d pairs, exec benchmarks %d.\n\n",
		r.cfg.command, r.started.UTC().Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second),
		r.cfg.warmup, r.cfg.n, r.cfg.execN)
	p("Machine: %d CPUs (%s), %.1f GiB RAM, Linux %s; %s; %s. Load average (1 min) at start %s, at end %s.\n\n",
		r.nproc, r.cpu, float64(r.memTotal)/(1<<30), r.kernel, r.runscVersion, r.hutchVersion, r.loadStart, r.loadEnd)

	// The aim.
	all := true
	var summary []string
	for _, l := range r.aimRows() {
		all = all && l.ratio() <= aim
		summary = append(summary, fmt.Sprintf("%s %.2fx", l.short, l.ratio()))
	}
	verdict := "✅ pass"
	if !all {
		verdict = "❌ miss"
	}
	p("**Aim: hutch within %.1fx of raw runsc** (ratio of medians, each latency below): %s — %s.\n\n",
		aim, verdict, strings.Join(summary, ", "))

	p("### Latency\n\n")
	p("| measurement | hutch median | hutch p90 | hutch min | runsc median | runsc p90 | runsc min | hutch/runsc | aim ≤ %.1fx |\n", aim)
	p("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, l := range r.aimRows() {
		p("| %s | %s | %s | %s | %s | %s | %s | %.2fx | %s |\n", l.label,
			ms(l.hutch.median), ms(l.hutch.p90), ms(l.hutch.min),
			ms(l.raw.median), ms(l.raw.p90), ms(l.raw.min), l.ratio(), mark(l.ratio()))
	}
	p("\n")

	p("What each side does:\n\n")
	p("- **create → first output**: from just before fork until the first byte of `hi` is read from the command's stdout pipe.\n")
	p("  - hutch: `hutch run --rm -- echo hi` on a fresh state root whose default image is already imported and unpacked. " +
		"`run --rm` does the work of `hutch create` (its files, cgroup and record) and then, as raw runsc runs a command, runs `runsc run` " +
		"without `--detach` with `echo hi` as the sandbox's init and hutch's pipes as its stdio (`--pass-fd`) " +
		"(docs/decisions/0010-run-rm-command-as-init.md); the removal comes after the first byte.\n")
	p("  - runsc: `runsc %s run --bundle B ID`: hutch's runsc flags, with runsc's own state root R and a fresh directory D for the overlay file. "+
		"B/config.json is the spec hutch generated for its own sandbox with process.args `[echo hi]`, terminal false, root.readonly false, "+
		"annotations dropped and cgroupsPath `%s/ID`: the same rootfs directory (the one hutch unpacked), the same mounts (%s), "+
		"namespaces and capabilities, and the same cgroup limits (%s). "+
		"The bundle and D are made before the clock starts; `runsc delete`, where runsc left state, runs after it stops.\n",
		placeholders(r.targetGlobals, "R", "D"), rawCgroupPrefix+"RUN", strings.Join(r.mounts, ", "), describeResources(r.resources))
	p("- **exec**: both sides exec into the same running hutch sandbox (default limits, otherwise idle). "+
		"hutch: `hutch exec ID -- CMD`, which starts no runsc process: it makes runsc exec's two calls (ExecuteAsync, WaitPID) on the sandbox's "+
		"control socket itself (docs/decisions/0008-exec-over-the-control-socket.md). runsc: `runsc %s exec ID CMD`, with the flags read from the sandbox process's command line. "+
		"`true` is timed to the CLI process's exit, `echo hi` to the first byte of output.\n\n",
		placeholders(r.targetGlobals, "HUTCH_ROOT/runsc", "HUTCH_ROOT/sandboxes/ID"))

	// Where the time goes.
	p("### Where the time goes\n\n")
	p("The steps of a sandbox's life, each timed on its own against its runsc counterpart, in the same %d pairs as the create → first output "+
		"latency above (medians): after its `hutch run --rm`, each hutch pass runs `hutch create` (hutch's own work is that of `run --rm`; "+
		"its init then waits), a first `hutch exec ID -- echo hi` into the sandbox just created (what `run` without `--rm` does after creating), "+
		"and `hutch rm -f`; after its `runsc run`, each runsc pass creates and starts a container "+
		"(`runsc run --detach`) from hutch's exact spec (hutch-init as init), execs `echo hi` into it, and deletes it.\n\n", r.cfg.n)
	p("| step | hutch | runsc | hutch median | runsc median | difference |\n")
	p("|---|---|---|---:|---:|---:|\n")
	step := func(name, hutchCmd, rawCmd string, l row) {
		p("| %s | %s | %s | %s | %s | %s |\n", name, hutchCmd, rawCmd, ms(l.hutch.median), ms(l.raw.median), signedMs(l.hutch.median-l.raw.median))
	}
	step("create and start", "`hutch create`", "`runsc run --detach`", r.create)
	step("first exec, to first output", "`hutch exec ID -- echo hi`", "`runsc exec ID echo hi`", r.firstExec)
	step("remove", "`hutch rm -f`", "`runsc delete --force`", r.rm)
	step("whole cycle, to exit", "`hutch run --rm -- echo hi`",
		fmt.Sprintf("`runsc run`, then `runsc delete` if state is left (after %d of %d runs)", r.rawRunDeletes, r.cfg.n), r.runCycle)
	p("| CLI start-up | `hutch ls -q` (reads the state root, runs no runsc) | — | %s | — | — |\n\n", ms(r.cliFloor.median))

	p("#### Inside `hutch create` and `hutch rm`\n\n")
	p("Here hutch runs with `--runsc SHIM`, SHIM being this benchmark program: it notes the time of each runsc call, "+
		"then execs the real runsc. Each phase runs from one call to the next; the shim adds about %s to each call "+
		"(`runsc state` through it against directly), included below. Medians of %d pairs each: "+
		"each run through the shim is paired, interleaved, with the same runsc calls made directly on a container of the same spec. "+
		"`runsc run --detach` returns before the sandbox's init has run; after it, `hutch create` waits for its init to report that it has started "+
		"(the Go runtime's start inside gVisor; docs/decisions/0032 measures it), which the last phase of `hutch create` includes.\n\n",
		ms(r.shimOverhead), r.cfg.n)
	phaseTable(p, "`hutch create`", r.createPhases, "`runsc run --detach`")
	phaseTable(p, "`hutch rm -f ID`", r.rmPhases, "`runsc delete --force`")

	over := r.run.hutch.median - r.run.raw.median
	var before float64
	if len(r.createPhases.phases) > 0 {
		before = summarize(r.createPhases.phases[0].samples).median
	}
	p("Reading it: `hutch run --rm` reaches its first output %s than `runsc run` (%s against %s). Split:\n\n",
		laterOrSooner(over), ms(r.run.hutch.median), ms(r.run.raw.median))
	p("- %s: hutch's own work before it starts runsc (the first phase of `hutch create` above: `run --rm` does the same work first);\n", ms(before))
	p("- %s: the rest: `runsc run` of hutch's spec (which adds the hutch-init mount, passes the stdio with `--pass-fd` "+
		"and joins the cgroup hutch made) against raw runsc's, the copy through hutch's pipes, and noise.\n\n", signedMs(over-before))
	p("Exec into a running sandbox: against `runsc exec`, hutch differs by %s (`true` to exit) and %s (`echo hi` to first output); "+
		"`hutch exec` starts no runsc process, and starting any hutch process costs %s (`hutch ls -q`).\n\n",
		signedMs(r.execTrue.hutch.median-r.execTrue.raw.median), signedMs(r.execEcho.hutch.median-r.execEcho.raw.median),
		ms(r.cliFloor.median))

	// Memory.
	p("### Memory\n\n")
	w.WriteString(renderStream(r))

	i := r.idle
	p("Idle sandbox, host side: a fresh `hutch create` (`%s` as init) against `runsc run --detach` "+
		"of the same spec with busybox `sleep 1000000` as init, read %s after start. "+
		"Summed over the host processes whose command line contains the sandbox ID (runsc's sandbox and gofer) and their descendants "+
		"(systrap stubs); PSS divides shared pages among the processes sharing them, RSS counts them in full in each. "+
		"Medians of %d sandboxes per side.\n\n",
		strings.Join(r.hutchInit, " "), r.cfg.settle, r.cfg.memN)
	p("| measurement | hutch | runsc | hutch/runsc |\n")
	p("|---|---:|---:|---:|\n")
	p("| PSS | %s | %s | %.2fx |\n", mib(i.hutchPSS.median), mib(i.rawPSS.median), i.hutchPSS.median/i.rawPSS.median)
	p("| RSS | %s | %s | %.2fx |\n", mib(i.hutchRSS.median), mib(i.rawRSS.median), i.hutchRSS.median/i.rawRSS.median)
	p("| host processes | %.0f | %.0f | |\n\n", i.hutchProcs.median, i.rawProcs.median)
	return w.String()
}

// phaseTable writes the phases of one hutch command next to the same runsc
// calls made directly in the same pairs.
func phaseTable(p func(string, ...any), cmd string, s *phaseSeries, rawWhat string) {
	p("| phase of %s | hutch median | runsc median |\n", cmd)
	p("|---|---:|---:|\n")
	total := 0.0
	for _, ph := range s.phases {
		st := summarize(ph.samples)
		total += st.median
		raw := "—"
		if d, ok := s.direct[ph.sub]; ok {
			raw = ms(summarize(d).median)
		}
		p("| %s | %s | %s |\n", ph.name, ms(st.median), raw)
	}
	p("| total (hutch: sum of the medians above; runsc: %s) | %s | %s |\n\n", rawWhat, ms(total), ms(summarize(s.rawTotal).median))
}

// placeholders shows runsc global flags with the run's temporary paths
// replaced by the names root and dir, so the report reads the same from
// run to run.
func placeholders(globals []string, root, dir string) string {
	out := make([]string, len(globals))
	for i, g := range globals {
		switch {
		case strings.HasPrefix(g, "--root="):
			g = "--root=" + root
		case strings.HasPrefix(g, "--overlay2=root:dir="):
			_, size, _ := strings.Cut(g, ",")
			g = "--overlay2=root:dir=" + dir + "," + size
		}
		out[i] = g
	}
	return strings.Join(out, " ")
}

func describeResources(res *specs.LinuxResources) string {
	if res == nil {
		return "none"
	}
	var parts []string
	if c := res.CPU; c != nil && c.Quota != nil && c.Period != nil {
		parts = append(parts, fmt.Sprintf("cpu quota %d/%d µs", *c.Quota, *c.Period))
	}
	if m := res.Memory; m != nil && m.Limit != nil {
		parts = append(parts, fmt.Sprintf("memory %s", mib(float64(*m.Limit))))
	}
	if p := res.Pids; p != nil && p.Limit != nil {
		parts = append(parts, fmt.Sprintf("pids %d", *p.Limit))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// renderStream is the streaming exec's table and the words around it.
func renderStream(r *report) string {
	var w strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&w, format, a...) }
	s := r.stream
	p("Streaming exec: `head -c %d /dev/zero` in the sandbox (busybox `head` writes 4 KiB at a time), and the same bytes from `dd bs=1048576`, "+
		"stdout read and counted by the benchmark through a pipe; %d run(s) per side (median), the two sides in turn, no warm-up: it follows the exec benchmarks in the same sandbox. "+
		"hutch relays the output through its own pipe (1 MiB, as root), spliced (splice(2)) into the caller's when that is a pipe, which it grows to as much; "+
		"raw runsc hands the benchmark's pipe (64 KiB) to the sandbox.\n\n",
		r.cfg.streamBytes, r.cfg.streamN)
	dd := r.streamDD.hutchRate.median > 0
	if dd {
		p("| measurement | hutch | runsc | hutch, `dd` | runsc, `dd` |\n")
		p("|---|---:|---:|---:|---:|\n")
	} else {
		p("| measurement | hutch | runsc |\n")
		p("|---|---:|---:|\n")
	}
	line := func(name string, f func(streamResult) (string, string)) {
		a, b := f(s)
		p("| %s | %s | %s |", name, a, b)
		if dd {
			a, b := f(r.streamDD)
			p(" %s | %s |", a, b)
		}
		p("\n")
	}
	line("peak RSS of the `hutch` process itself (VmHWM, sampled every 10 ms)", func(s streamResult) (string, string) { return mib(s.hutchHWM.median), "—" })
	line("getrusage ru_maxrss of the CLI child (hutch: the hutch process, which starts no runsc; runsc: `runsc exec`)", func(s streamResult) (string, string) {
		return mib(s.hutchMaxRSS.median), mib(s.rawMaxRSS.median)
	})
	line("CPU time of the CLI child (user + system)", func(s streamResult) (string, string) { return ms(s.hutchCPU.median), ms(s.rawCPU.median) })
	line("time to stream it", func(s streamResult) (string, string) { return ms(s.hutchTime.median), ms(s.rawTime.median) })
	line("throughput", func(s streamResult) (string, string) {
		return fmt.Sprintf("%.0f MB/s", s.hutchRate.median), fmt.Sprintf("%.0f MB/s", s.rawRate.median)
	})
	p("\n")
	return w.String()
}
