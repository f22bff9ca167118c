package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// bench holds the state of one benchmark run: a fresh hutch state root, a
// raw runsc state root, and one long-lived hutch sandbox that exec runs in.
type bench struct {
	cfg   config
	hutch string
	tmp   string
	root  string   // HUTCH_ROOT
	env   []string // environment of every command
	nonce string
	raw   *rawSide

	// target is the sandbox exec benchmarks run in (both sides).
	target string
	// targetGlobals are the runsc global flags of target, as its
	// sandbox process was started with them.
	targetGlobals []string
}

// sandboxRecord is what the bench reads from `hutch inspect`.
type sandboxRecord struct {
	ID     string `json:"id"`
	Rootfs string `json:"rootfs"`
	Pid    int    `json:"pid"`
}

func newBench(c config) (*bench, error) {
	for _, f := range []string{"hutch", "hutch-init", "runsc", "images/busybox.tar"} {
		if _, err := os.Stat(filepath.Join(c.bin, f)); err != nil {
			return nil, fmt.Errorf("%w (run `make build`)", err)
		}
	}
	tmp, err := os.MkdirTemp("", "hutch-bench-")
	if err != nil {
		return nil, err
	}
	nb := make([]byte, 3)
	rand.Read(nb)
	b := &bench{
		cfg:   c,
		hutch: filepath.Join(c.bin, "hutch"),
		tmp:   tmp,
		root:  filepath.Join(tmp, "hutch"),
		nonce: hex.EncodeToString(nb),
		raw: &rawSide{
			runsc: filepath.Join(c.bin, "runsc"),
			root:  filepath.Join(tmp, "runsc"),
			dir:   filepath.Join(tmp, "raw"),
			live:  map[string]bool{},
		},
	}
	b.raw.cgroupParent = rawCgroupPrefix + b.nonce
	// A clean environment: no HUTCH_* setting from the caller's shell.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HUTCH_") {
			b.env = append(b.env, kv)
		}
	}
	b.env = append(b.env, "HUTCH_ROOT="+b.root)
	for _, d := range []string{b.raw.root, b.raw.dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return b, err
		}
	}
	return b, nil
}

// hutchCmd runs hutch with args to completion and returns its stdout.
func (b *bench) hutchCmd(ctx context.Context, args ...string) (string, error) {
	r, err := timed(ctx, runOpts{env: b.env}, b.hutch, args...)
	return strings.TrimSpace(string(r.head)), err
}

// hutchCreate creates a sandbox with hutch's defaults and returns its record.
func (b *bench) hutchCreate(ctx context.Context) (sandboxRecord, error) {
	id, err := b.hutchCmd(ctx, "create")
	if err != nil {
		return sandboxRecord{}, err
	}
	out, err := b.hutchCmd(ctx, "inspect", "--format", "debug", id)
	if err != nil {
		return sandboxRecord{}, err
	}
	var rec sandboxRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		return rec, fmt.Errorf("hutch inspect %s: %w", id, err)
	}
	return rec, nil
}

// setup creates the target sandbox and derives the raw side from it: the
// same rootfs, spec and disk size, and the runsc global flags of the
// target for raw exec.
func (b *bench) setup(ctx context.Context) error {
	rec, err := b.hutchCreate(ctx)
	if err != nil {
		return err
	}
	b.target = rec.ID
	specPath := filepath.Join(b.root, "sandboxes", rec.ID, "bundle", "config.json")
	sb, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(sb, &b.raw.spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	if b.raw.spec.Root == nil || b.raw.spec.Root.Path != rec.Rootfs {
		return fmt.Errorf("hutch's spec and inspect disagree on the rootfs of %s", rec.ID)
	}
	if b.raw.spec.Process == nil || b.raw.spec.Linux == nil {
		return fmt.Errorf("%s: no process or linux section", specPath)
	}
	if b.targetGlobals, err = runscGlobals(rec.Pid); err != nil {
		return err
	}
	return b.raw.setGlobals(b.targetGlobals)
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

// rawExec runs `runsc exec` of args in the target sandbox, with the
// target's runsc flags.
func (b *bench) rawExec(ctx context.Context, o runOpts, args ...string) (result, error) {
	full := append(append(append([]string{}, b.targetGlobals...), "exec", b.target), args...)
	return timed(ctx, o, b.raw.runsc, full...)
}

// hutchExec runs `hutch exec` of args in hutch sandbox id.
func (b *bench) hutchExec(ctx context.Context, id string, args ...string) (result, error) {
	return b.hutchExecOpts(ctx, runOpts{}, id, args...)
}

func (b *bench) hutchExecOpts(ctx context.Context, o runOpts, id string, args ...string) (result, error) {
	o.env = b.env
	return timed(ctx, o, b.hutch, append([]string{"exec", id, "--"}, args...)...)
}

// rawID names the i-th raw container of a benchmark.
func (b *bench) rawID(what string, i int) string {
	return fmt.Sprintf("bench-%s-%s-%d", what, b.nonce, i)
}

// pair is one benchmark's two sides.
type pair struct {
	hutch, raw func(ctx context.Context, i int) (result, error)
}

// interleave runs warm untimed pairs, then n measured pairs with the order of
// the sides alternating (hutch first on even i, raw first on odd i), so
// neither side always follows the other.
func (b *bench) interleave(ctx context.Context, name string, warm, n int, p pair) (hutch, raw []result, err error) {
	start := time.Now()
	for i := 0; i < warm; i++ {
		if _, err := p.hutch(ctx, -1-i); err != nil {
			return nil, nil, fmt.Errorf("%s: warm-up: %w", name, err)
		}
		if _, err := p.raw(ctx, -1-i); err != nil {
			return nil, nil, fmt.Errorf("%s: warm-up: %w", name, err)
		}
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		first, second := p.hutch, p.raw
		if i%2 == 1 {
			first, second = p.raw, p.hutch
		}
		r1, err := first(ctx, i)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		r2, err := second(ctx, i)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		if i%2 == 1 {
			r1, r2 = r2, r1
		}
		hutch, raw = append(hutch, r1), append(raw, r2)
	}
	progress("%-28s %d pairs in %s", name, n, time.Since(start).Round(time.Millisecond))
	return hutch, raw, nil
}

// expect checks a run's stdout.
func expect(r result, err error, want string) (result, error) {
	if err == nil && !bytes.Equal(r.head, []byte(want)) {
		err = fmt.Errorf("output %q, want %q", r.head, want)
	}
	return r, err
}

// measure runs every benchmark and collects the report's numbers.
func (b *bench) measure(ctx context.Context) (*report, error) {
	rep := &report{cfg: b.cfg, started: time.Now()}
	if err := b.machine(ctx, rep); err != nil {
		return nil, err
	}
	progress("setting up in %s", b.tmp)
	if err := b.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	rep.targetGlobals = b.targetGlobals
	rep.resources = b.raw.spec.Linux.Resources
	for _, m := range b.raw.spec.Mounts {
		rep.mounts = append(rep.mounts, m.Destination)
	}
	rep.hutchInit = b.raw.spec.Process.Args

	echo := []string{"echo", "hi"}

	// 1. create -> first output, and the steps of hutch run one by one.
	if err := b.lifecycle(ctx, rep); err != nil {
		return nil, err
	}

	// 2. exec true -> exit.
	hutchTrue, rawTrue, err := b.interleave(ctx, "exec true", b.cfg.warmup, b.cfg.execN, pair{
		hutch: func(ctx context.Context, i int) (result, error) { return b.hutchExec(ctx, b.target, "true") },
		raw:   func(ctx context.Context, i int) (result, error) { return b.rawExec(ctx, runOpts{}, "true") },
	})
	if err != nil {
		return nil, err
	}
	rep.execTrue = row{summarize(seconds(hutchTrue, exitTime)), summarize(seconds(rawTrue, exitTime))}

	// 3. exec echo hi -> first output.
	hutchEcho, rawEcho, err := b.interleave(ctx, "exec echo hi", b.cfg.warmup, b.cfg.execN, pair{
		hutch: func(ctx context.Context, i int) (result, error) {
			r, err := b.hutchExec(ctx, b.target, echo...)
			return expect(r, err, "hi\n")
		},
		raw: func(ctx context.Context, i int) (result, error) {
			r, err := b.rawExec(ctx, runOpts{}, echo...)
			return expect(r, err, "hi\n")
		},
	})
	if err != nil {
		return nil, err
	}
	rep.execEcho = row{summarize(seconds(hutchEcho, firstByte)), summarize(seconds(rawEcho, firstByte))}

	// The cost of starting the hutch CLI: a command that reads the state
	// root and runs no runsc.
	var ls []result
	for i := 0; i < b.cfg.n; i++ {
		r, err := timed(ctx, runOpts{env: b.env}, b.hutch, "ls", "-q")
		if err != nil {
			return nil, err
		}
		ls = append(ls, r)
	}
	rep.cliFloor = summarize(seconds(ls, exitTime))

	// Inside hutch create, exec and rm: the time between their runsc calls.
	if err := b.allPhases(ctx, rep); err != nil {
		return nil, err
	}
	if rep.shimOverhead, err = b.shimCost(ctx); err != nil {
		return nil, err
	}

	// 4. memory: the CLI during a streaming exec, and idle sandboxes.
	if err := b.stream(ctx, rep); err != nil {
		return nil, err
	}
	if err := b.idleMemory(ctx, rep); err != nil {
		return nil, err
	}
	rep.elapsed = time.Since(rep.started)
	rep.loadEnd = loadAverage()
	return rep, nil
}

// measureStream runs the streaming exec alone, in a sandbox of its own.
func (b *bench) measureStream(ctx context.Context) (*report, error) {
	rep := &report{cfg: b.cfg, started: time.Now()}
	if err := b.machine(ctx, rep); err != nil {
		return nil, err
	}
	if err := b.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := b.stream(ctx, rep); err != nil {
		return nil, err
	}
	rep.elapsed = time.Since(rep.started)
	rep.loadEnd = loadAverage()
	return rep, nil
}

// stream times a streaming exec of cfg.streamBytes and records the memory
// and CPU time of the CLI processes: once as `head -c` writes it (4 KiB
// writes, gVisor's cost per write dominates), once as `dd` with 1 MiB
// writes (the host side's copy does).
func (b *bench) stream(ctx context.Context, rep *report) error {
	n := strconv.FormatInt(b.cfg.streamBytes, 10)
	check := func(r result, err error) (result, error) {
		if err == nil && r.bytes != b.cfg.streamBytes {
			err = fmt.Errorf("streaming exec: got %d bytes, want %s", r.bytes, n)
		}
		return r, err
	}
	const bs = 1 << 20
	for _, w := range []struct {
		name string
		args []string
		res  *streamResult
	}{
		{"exec stream", []string{"head", "-c", n, "/dev/zero"}, &rep.stream},
		{"exec stream, 1 MiB writes", []string{"dd", "if=/dev/zero", "bs=" + strconv.Itoa(bs), "count=" + strconv.FormatInt(b.cfg.streamBytes/bs, 10)}, &rep.streamDD},
	} {
		if w.res == &rep.streamDD && b.cfg.streamBytes%bs != 0 {
			continue
		}
		hutchS, rawS, err := b.interleave(ctx, w.name, 0, b.cfg.streamN, pair{
			hutch: func(ctx context.Context, i int) (result, error) {
				return check(b.hutchExecOpts(ctx, runOpts{sampleHWM: true}, b.target, w.args...))
			},
			raw: func(ctx context.Context, i int) (result, error) {
				return check(b.rawExec(ctx, runOpts{sampleHWM: true}, w.args...))
			},
		})
		if err != nil {
			return err
		}
		rate := func(r result) float64 { return float64(r.bytes) / r.exit.Seconds() / 1e6 }
		cpu := func(r result) float64 { return r.cpu.Seconds() }
		*w.res = streamResult{
			hutchHWM:    summarize(values(hutchS, func(r result) float64 { return float64(r.hwm) })),
			hutchMaxRSS: summarize(values(hutchS, func(r result) float64 { return float64(r.maxRSS) })),
			rawMaxRSS:   summarize(values(rawS, func(r result) float64 { return float64(r.maxRSS) })),
			hutchRate:   summarize(values(hutchS, rate)),
			rawRate:     summarize(values(rawS, rate)),
			hutchTime:   summarize(seconds(hutchS, exitTime)),
			rawTime:     summarize(seconds(rawS, exitTime)),
			hutchCPU:    summarize(values(hutchS, cpu)),
			rawCPU:      summarize(values(rawS, cpu)),
		}
		progress("%-28s hutch %.0f MB/s, CPU %.2f s; runsc %.0f MB/s, CPU %.2f s", w.name,
			w.res.hutchRate.median, w.res.hutchCPU.median, w.res.rawRate.median, w.res.rawCPU.median)
	}
	return nil
}

// idleMemory measures the host memory of fresh idle sandboxes: hutch's
// (hutch-init as init) against raw runsc ones (busybox sleep as init).
func (b *bench) idleMemory(ctx context.Context, rep *report) error {
	start := time.Now()
	var hutchM, rawM []hostMemory
	for i := 0; i < b.cfg.memN; i++ {
		rec, err := b.hutchCreate(ctx)
		if err != nil {
			return err
		}
		id := b.rawID("idle", i)
		if _, err := b.raw.runDetached(ctx, id, []string{"sleep", "1000000"}); err != nil {
			return err
		}
		sleepCtx(ctx, b.cfg.settle)
		memHutch, err := sandboxMemory(rec.ID)
		if err != nil {
			return err
		}
		memRaw, err := sandboxMemory(id)
		if err != nil {
			return err
		}
		hutchM, rawM = append(hutchM, memHutch), append(rawM, memRaw)
		if _, err := b.hutchCmd(ctx, "rm", "-f", rec.ID); err != nil {
			return err
		}
		if _, err := b.raw.remove(ctx, id); err != nil {
			return err
		}
	}
	pss := func(m hostMemory) float64 { return float64(m.pss) }
	rss := func(m hostMemory) float64 { return float64(m.rss) }
	procs := func(m hostMemory) float64 { return float64(m.procs) }
	rep.idle = idleResult{
		hutchPSS: summarize(memValues(hutchM, pss)), rawPSS: summarize(memValues(rawM, pss)),
		hutchRSS: summarize(memValues(hutchM, rss)), rawRSS: summarize(memValues(rawM, rss)),
		hutchProcs: summarize(memValues(hutchM, procs)), rawProcs: summarize(memValues(rawM, procs)),
	}
	progress("%-28s %d pairs in %s", "idle sandbox memory", b.cfg.memN, time.Since(start).Round(time.Millisecond))
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// machine records what the numbers were measured on.
func (b *bench) machine(ctx context.Context, rep *report) error {
	rep.nproc = runtime.NumCPU()
	rep.loadStart = loadAverage()
	if u, err := exec.CommandContext(ctx, "uname", "-r").Output(); err == nil {
		rep.kernel = strings.TrimSpace(string(u))
	}
	v, err := exec.CommandContext(ctx, b.raw.runsc, "--version").Output()
	if err != nil {
		return fmt.Errorf("runsc --version: %w", err)
	}
	rep.runscVersion, _, _ = strings.Cut(strings.TrimSpace(string(v)), "\n")
	if out, err := b.hutchCmd(ctx, "version"); err == nil {
		rep.hutchVersion, _, _ = strings.Cut(out, "\n")
	}
	if ci, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(ci), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				rep.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if mi, err := os.ReadFile("/proc/meminfo"); err == nil {
		rep.memTotal, _ = kBField(mi, "MemTotal")
	}
	return nil
}

// loadAverage is the 1-minute load average of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// cleanup removes every sandbox and raw container the run made, and its
// temporary directory.
func (b *bench) cleanup() {
	ctx := context.Background()
	if ids, err := b.hutchCmd(ctx, "ls", "-q"); err == nil {
		for _, id := range strings.Fields(ids) {
			if _, err := b.hutchCmd(ctx, "rm", "-f", id); err != nil {
				progress("cleanup: %v", err)
			}
		}
	} else if _, statErr := os.Stat(b.root); statErr == nil {
		progress("cleanup: hutch ls: %v", err)
	}
	b.raw.cleanup()
	stopBuilder(filepath.Join(b.root, "buildkit"))
	unmountNullNetNS(b.raw.root)
	unmountNullNetNS(filepath.Join(b.root, "runsc"))
	if err := os.RemoveAll(b.tmp); err != nil {
		progress("cleanup: %v", err)
	}
}

// stopBuilder stops the buildkitd that hutch started under dir (when the
// default image had to be built) and waits for it: no daemon outlives the
// run's temporary root.
func stopBuilder(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "supervisor.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
}
