// Command persist measures hutch's snapshots, setup cache, pause/resume and
// fork, side by side with raw runsc where there is a raw equivalent, and
// writes the results into its section of docs/benchmarks.md.
//
//	go run ./integration/bench/persist -bin bin -out docs/benchmarks.md
//
// It needs root and the built binaries in -bin. Everything it creates lives
// in a temporary state root, removed at the end. -only runs some of the
// measurements (snapshot, setup, pause, fork); -base DIR also times the hutch
// in DIR on the same sandboxes, alternating with -bin's, in a column of
// its own: two builds compared in one run.
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"hutch.dev/hutch/integration/bench/benchcmd"
	"hutch.dev/hutch/integration/bench/benchdoc"
	"hutch.dev/hutch/integration/bench/benchexit"
)

type bench struct {
	bin, root string
	// base is the hutch binary compared against, or "".
	base string
	// load0 is the load average at the start; runs the repetitions.
	load0 string
	runs  int
	rows  [][]string
	// notes follow the table.
	notes []string
	// snap and pause are the charts' points.
	snap, pause curves
}

func main() {
	bin := flag.String("bin", "bin", "directory with hutch, hutch-init, runsc and images/")
	out := flag.String("out", "docs/benchmarks.md", "markdown file to update")
	runs := flag.Int("runs", 3, "repetitions of each measurement (median reported)")
	only := flag.String("only", "snapshot,setup,pause,fork", "comma-separated measurements to run")
	base := flag.String("base", "", "directory with another hutch to time alongside (before/after)")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		benchexit.Fatal(err)
	}
	root, err := os.MkdirTemp("", "hutch-bench-persist-")
	if err != nil {
		benchexit.Fatal(err)
	}
	b := &bench{bin: abs, root: root, load0: loadavg(), runs: *runs,
		snap: curves{file: "persist-snapshot.png", title: "Snapshot against the size of the changes", x: "MiB of changes",
			names: []string{"hutch snapshot", "runsc tar rootfs-upper"}},
		pause: curves{file: "persist-pause.png", title: "Pause and resume against resident memory", x: "MiB resident",
			names: []string{"hutch pause", "runsc checkpoint", "hutch pause, until its detached end", "hutch resume", "runsc restore"}},
	}
	if *base != "" {
		if b.base, err = filepath.Abs(filepath.Join(*base, "hutch")); err != nil {
			benchexit.Fatal(err)
		}
	}
	defer b.cleanup()
	benchexit.AtExit(b.cleanup)

	want := map[string]bool{}
	for _, m := range strings.Split(*only, ",") {
		want[strings.TrimSpace(m)] = true
	}
	if want["snapshot"] {
		b.snapshots(*runs)
	}
	if want["setup"] {
		b.setupCache(*runs)
	}
	if want["pause"] {
		for _, mib := range []int{64, 256, 512} {
			b.pauseResume(mib, *runs)
		}
	}
	if want["fork"] {
		b.fork(10)
	}

	if err := b.write(*out); err != nil {
		benchexit.Fatal(err)
	}
}

func (b *bench) cleanup() {
	out, _ := b.hutch("ls", "-q")
	for _, id := range strings.Fields(out) {
		b.hutch("rm", "-f", id) //nolint:errcheck
	}
	os.RemoveAll(b.root)
}

func (b *bench) hutch(args ...string) (string, error) {
	return b.hutchWith(filepath.Join(b.bin, "hutch"), args...)
}

func (b *bench) hutchWith(bin string, args ...string) (string, error) {
	if len(args) > 0 && args[0] == "create" {
		// The tiny test image: what is measured is hutch's work on a
		// sandbox's changes, not the image.
		args = append([]string{"create", "--image", "busybox"}, args[1:]...)
	}
	c := exec.Command(bin, args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+b.root)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("hutch %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func (b *bench) must(args ...string) string {
	out, err := b.hutch(args...)
	if err != nil {
		benchexit.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// timed runs hutch args and returns how long it took.
func (b *bench) timed(args ...string) time.Duration {
	start := time.Now()
	b.must(args...)
	return time.Since(start)
}

// timedBase runs the base hutch (-base) and returns how long it took.
func (b *bench) timedBase(args ...string) time.Duration {
	start := time.Now()
	if _, err := b.hutchWith(b.base, args...); err != nil {
		benchexit.Fatal(err)
	}
	return time.Since(start)
}

// settle waits until no detached hutch of this benchmark's root runs (the
// end of a pause, the removal of a used checkpoint) and the kernel has
// written dirty pages back (sync), so that each timed command, of hutch or
// of raw runsc, starts without the previous one's work in the background.
func (b *bench) settle() {
	b.waitDetached()
	syscall.Sync()
}

// waitDetached waits, at most 30 s, until no hutch process started with
// this benchmark's root runs a hidden command (named "__...").
func (b *bench) waitDetached() {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if !b.detachedRunning() {
			return
		}
	}
	benchexit.Fatal(fmt.Errorf("detached hutch processes still run after 30s"))
}

func (b *bench) detachedRunning() bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	root := []byte("\x00" + b.root + "\x00")
	for _, p := range procs {
		c, err := os.ReadFile(p)
		if err == nil && bytes.Contains(c, root) && bytes.Contains(c, []byte("\x00__")) {
			return true
		}
	}
	return false
}

// alternate runs measure, and with -base measureBase, in turns: base
// first in even rounds, last in odd ones, so that neither always follows
// the same work.
func (b *bench) alternate(round int, measure, measureBase func()) {
	switch {
	case b.base == "":
		measure()
	case round%2 == 0:
		measureBase()
		measure()
	default:
		measure()
		measureBase()
	}
}

// baseCell is the base hutch's median, or nothing without -base.
func (b *bench) baseCell(ds []time.Duration) []string {
	if b.base == "" {
		return nil
	}
	return []string{ms(median(ds))}
}

// runsc runs the pinned runsc with the global flags hutch uses for sandbox id.
func (b *bench) runsc(id string, args ...string) time.Duration {
	var disk struct {
		Disk int64 `json:"disk"`
	}
	json.Unmarshal([]byte(b.must("inspect", id)), &disk) //nolint:errcheck
	return b.runscIn(filepath.Join(b.root, "sandboxes", id), disk.Disk, args...)
}

func (b *bench) runscIn(dir string, disk int64, args ...string) time.Duration {
	full := append([]string{
		"--root", filepath.Join(b.root, "runsc"), "--network=none", "--gofer-network-namespace=new",
		fmt.Sprintf("--overlay2=root:dir=%s,size=%d", dir, disk),
	}, args...)
	c := exec.Command(filepath.Join(b.bin, "runsc"), full...)
	// Not a pipe: runsc restore's sandbox inherits stderr and would hold
	// a pipe open forever.
	errf, err := os.CreateTemp(b.root, "runsc-stderr-")
	if err != nil {
		benchexit.Fatal(err)
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	c.Stderr = errf
	start := time.Now()
	if err := c.Run(); err != nil {
		msg, _ := os.ReadFile(errf.Name())
		benchexit.Fatalf("runsc %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return time.Since(start)
}

func median(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// faster says how much faster than slow fast was (or how much slower).
func faster(slow, fast time.Duration) string {
	if fast > slow {
		return fmt.Sprintf("%.1fx slower", float64(fast)/float64(slow))
	}
	return fmt.Sprintf("%.1fx faster", float64(slow)/float64(fast))
}

// ratio is hutch's time as a multiple of raw runsc's.
func ratio(hutch, raw time.Duration) string {
	return fmt.Sprintf("%.1fx raw", float64(hutch)/float64(raw))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// row adds a table row: operation, hutch, raw runsc, note, then the base
// hutch's time with -base.
func (b *bench) row(op, hutch, raw, note string, base ...string) {
	r := []string{op, hutch, raw, note}
	if b.base != "" {
		r = append(r, append(base, "")[0])
	}
	b.rows = append(b.rows, r)
}

// snapshots: hutch snapshot of 10, 50 and 100 MiB of random changes, and of
// 100 MiB that compress, vs raw runsc tar.
func (b *bench) snapshots(runs int) {
	for _, c := range []struct {
		mib  int
		text bool
	}{{10, false}, {50, false}, {100, false}, {100, true}} {
		mib := c.mib
		id := b.must("create")
		what, note := fmt.Sprintf("snapshot, %d MiB of changes", mib), "hutch adds a SHA-256 of the layer (random data does not compress: stored as a plain tar, its digest is its diff_id) and storing it (fsynced)"
		fill := fmt.Sprintf("head -c %d /dev/urandom > /root/changes", mib<<20)
		if c.text {
			what, note = fmt.Sprintf("snapshot, %d MiB of changes that compress (base64 text)", mib), "hutch adds zstd, two SHA-256 (the blob's and the diff_id) and storing the layer (fsynced)"
			fill = fmt.Sprintf("head -c %d /dev/urandom | base64 > /root/changes", mib<<20*3/4)
		}
		b.must("exec", id, "--", "sh", "-c", fill)
		var hutchT, rawT, baseT []time.Duration
		raw := func() {
			tmp := filepath.Join(b.root, "upper.tar")
			b.settle()
			rawT = append(rawT, b.runsc(id, "tar", "rootfs-upper", "--file", tmp, id))
			os.Remove(tmp)
		}
		for i := 0; i < runs; i++ {
			// Raw runsc first in odd rounds, last in even ones.
			if i%2 == 1 {
				raw()
			}
			b.alternate(i, func() {
				b.settle()
				hutchT = append(hutchT, b.timed("snapshot", "-t", fmt.Sprintf("bench-snap-%d%s-%d", mib, map[bool]string{true: "-text"}[c.text], i), id))
			}, func() {
				b.settle()
				baseT = append(baseT, b.timedBase("snapshot", "-t", fmt.Sprintf("bench-base-%d%s-%d", mib, map[bool]string{true: "-text"}[c.text], i), id))
			})
			if i%2 == 0 {
				raw()
			}
		}
		if !c.text {
			b.snap.add(mib, map[string]float64{"hutch snapshot": msf(median(hutchT)), "runsc tar rootfs-upper": msf(median(rawT))})
		}
		if mib == 100 && !c.text {
			b.snapshotFloor(median(rawT), runs)
		}
		// Raw runsc tar's time swings several-fold from run to run on
		// this host: the fastest runs of each side are compared too.
		b.row(what, ms(median(hutchT))+" (min "+ms(hutchT[0])+")", ms(median(rawT))+" (min "+ms(rawT[0])+", `runsc tar rootfs-upper`)",
			ratio(median(hutchT), median(rawT))+", "+ratio(hutchT[0], rawT[0])+" of the fastest; "+note,
			b.baseCell(baseT)...)
		b.must("rm", "-f", id)
	}
	b.must("image", "prune")
}

// setupCache: create that runs --setup vs create that hits the cache.
func (b *bench) setupCache(runs int) {
	setup := "i=0; while [ $i -lt 3000 ]; do echo $i > /root/f$i; i=$((i+1)); done; head -c 20971520 /dev/urandom > /root/blob"
	var miss, hit, warm, plain []time.Duration
	for i := 0; i < runs; i++ {
		cmd := fmt.Sprintf("%s # run %d", setup, i) // a new cache key per run
		miss = append(miss, b.timed("create", "--setup", cmd))
		hit = append(hit, b.timed("create", "--setup", cmd))
		warm = append(warm, b.timed("create", "--setup", cmd))
		plain = append(plain, b.timed("create"))
	}
	m, h, w := median(miss), median(hit), median(warm)
	b.row("create with --setup (runs it: 3000 files + 20 MiB)", ms(m), "", "")
	b.row("create with --setup, cached, first use", ms(h), "", faster(m, h)+" than running the setup; unpacks the cached layer")
	b.row("create with --setup, cached, later uses", ms(w), "", faster(m, w)+" than running the setup; layer already unpacked")
	b.row("create, no setup", ms(median(plain)), "", "")
	out, _ := b.hutch("ls", "-q")
	for _, id := range strings.Fields(out) {
		b.must("rm", "-f", id)
	}
	b.must("image", "prune")
}

// pauseResume: hutch pause/resume of a sandbox with mib MiB resident vs raw
// runsc checkpoint and restore of the same sandbox.
func (b *bench) pauseResume(mib, runs int) {
	id := b.must("create", "--memory", fmt.Sprintf("%dm", mib+512))
	// gVisor's /tmp is a memory-backed tmpfs: its pages are resident
	// sandbox memory and go into the checkpoint.
	b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/resident", mib<<20))
	b.must("exec", "-d", id, "--", "sh", "-c", "while true; do sleep 1; done")
	var pause, ended, resume, rawCk, rawRestore, basePause, baseResume []time.Duration
	for i := 0; i < runs; i++ {
		b.alternate(i, func() {
			b.settle()
			start := time.Now()
			b.must("pause", id)
			pause = append(pause, time.Since(start))
			b.waitDetached()
			ended = append(ended, time.Since(start))
			b.settle()
			resume = append(resume, b.timed("resume", id))
		}, func() {
			b.settle()
			basePause = append(basePause, b.timedBase("pause", id))
			b.settle()
			baseResume = append(baseResume, b.timedBase("resume", id))
		})

		// Raw: checkpoint the running sandbox, restore it as another
		// container from a copy of its bundle.
		img := filepath.Join(b.root, "raw-ck")
		os.MkdirAll(img, 0o700)
		b.settle()
		rawCk = append(rawCk, b.runsc(id, "checkpoint", "--leave-running", "--image-path", img, id))
		rawID := fmt.Sprintf("bench-raw-%d", i)
		rawDir := filepath.Join(b.root, rawID)
		bundle := mustCopyBundle(filepath.Join(b.root, "sandboxes", id, "bundle"), filepath.Join(rawDir, "bundle"), rawID)
		b.settle()
		rawRestore = append(rawRestore, b.runscIn(rawDir, 1<<30, "restore", "--detach", "--bundle", bundle, "--image-path", img, rawID))
		b.runscIn(rawDir, 1<<30, "delete", "--force", rawID)
		os.RemoveAll(img)
		os.RemoveAll(rawDir)
	}
	b.pause.add(mib, map[string]float64{
		"hutch pause": msf(median(pause)), "runsc checkpoint": msf(median(rawCk)),
		"hutch pause, until its detached end": msf(median(ended)),
		"hutch resume":                        msf(median(resume)), "runsc restore": msf(median(rawRestore)),
	})
	b.row(fmt.Sprintf("pause, %d MiB resident", mib), ms(median(pause)), ms(median(rawCk))+" (`runsc checkpoint`)",
		ratio(median(pause), median(rawCk))+"; hutch adds recording the checkpoint and killing the sandbox; its checksums (XXH64) and the teardown of its runtime follow in a detached process (docs/decisions/0029)",
		b.baseCell(basePause)...)
	b.row(fmt.Sprintf("pause, %d MiB resident, until its detached end has finished", mib), ms(median(ended)), "",
		"the checkpoint checksummed and the sandbox's runtime gone: what a pause waited for before it returned until docs/decisions/0029", b.baseCell(basePause)...)
	b.row(fmt.Sprintf("resume, %d MiB resident", mib), ms(median(resume)), ms(median(rawRestore))+" (`runsc restore`)",
		ratio(median(resume), median(rawRestore))+"; hutch adds verifying every checkpoint file (XXH64 per 16 MiB chunk, on every CPU) and restoring in a cgroup of its own",
		b.baseCell(baseResume)...)
	b.must("rm", "-f", id)
}

// snapshotFloor notes what a snapshot of 100 MiB cannot avoid and raw
// runsc tar does not do, timed here: the layer's SHA-256 (OCI names a
// layer by it).
func (b *bench) snapshotFloor(rawT time.Duration, runs int) {
	data := make([]byte, 100<<20)
	rand.Read(data)
	var hashT []time.Duration
	for i := 0; i < max(runs, 5); i++ {
		start := time.Now()
		sha256.Sum256(data)
		hashT = append(hashT, time.Since(start))
	}
	h := median(hashT)
	aim := rawT * 3 / 2
	than := "more than"
	if h > aim {
		than = "less than"
	}
	note := fmt.Sprintf("Where a snapshot of 100 MiB goes beyond `runsc tar rootfs-upper` (%s here): the SHA-256 of the layer, by which OCI names it, takes %s on one core of this host (timed by this program: %.1fx raw runsc tar's median on its own); the layer is written to the state root and fsynced before it is tagged. runsc tar does neither. A snapshot hashes beside the export, the writes and their writeback (docs/decisions/0030), on two CPUs that the sandbox's export shares. The aim, 1.5x raw runsc tar, is %s: %s the SHA-256 alone.",
		ms(rawT), ms(h), float64(h)/float64(rawT), ms(aim), than)
	// Even spread over both CPUs (the layer cut into several, each
	// hashed on its own), the hash and the export (its wall time stands
	// for its CPU time) share two CPUs.
	if both := (h + rawT) / 2; both > aim {
		note += fmt.Sprintf(" Spread perfectly over both CPUs (a layer cut in two, each part hashed at once), the hash and runsc's export alone would still take %s. What would close it is a layer not named by the SHA-256 of its bytes when the snapshot returns; OCI names layers so: hutch and containerd check the digest when they unpack a layer, and registries when they receive one.", ms(both))
	}
	b.notes = append(b.notes, note)
}

// fork: N copies of a running sandbox.
func (b *bench) fork(n int) {
	id := b.must("create")
	b.must("exec", "-d", id, "--", "sh", "-c", "while true; do sleep 1; done")
	start := time.Now()
	kids := strings.Fields(b.must("fork", "--count", fmt.Sprint(n), id))
	d := time.Since(start)
	b.row(fmt.Sprintf("fork, N=%d", n), ms(d), "", fmt.Sprintf("%s per copy; one checkpoint (not checksummed: used at once, then removed), %d restores, several at a time", ms(d/time.Duration(n)), n))
	for _, k := range append(kids, id) {
		b.must("rm", "-f", k)
	}
}

func (b *bench) write(path string) error {
	var s strings.Builder
	s.WriteString("## Persistence: snapshots, setup cache, pause/resume, fork\n\n")
	fmt.Fprintf(&s, "Produced by `make bench` (`go run ./integration/bench/persist -bin bin -out docs/benchmarks.md`) on %s (%d CPUs; load average (1 min) at start %s, at end %s: the machine is shared, compare rows of one run, not runs); wall time of each command, median of %d runs, on the busybox image. Raw runsc is the runsc `make` builds (the pinned gVisor with the patches in tools/runsc), with the same flags, bundle and checkpoint as hutch. Each snapshot, pause, resume and raw runsc command starts on a settled host (hutch and raw runsc first in turn): no detached hutch process of the previous step running, dirty pages written back (sync).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), cpus(), b.load0, loadavg(), b.runs)
	if b.base != "" {
		fmt.Fprintf(&s, "The last column is %s, timed alternately with the hutch measured, on the same sandboxes.\n\n", b.base)
		s.WriteString("| operation | hutch | raw runsc | note | base hutch |\n| --- | --- | --- | --- | --- |\n")
	} else {
		s.WriteString("| operation | hutch | raw runsc | note |\n| --- | --- | --- | --- |\n")
	}
	for _, r := range b.rows {
		s.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	for _, n := range b.notes {
		s.WriteString("\n" + n + "\n")
	}
	for _, c := range []*curves{&b.snap, &b.pause} {
		p, err := c.draw(filepath.Dir(path))
		if err != nil {
			return err
		}
		if p != "" {
			fmt.Fprintf(&s, "\n![%s](%s)\n", strings.TrimSuffix(c.file, ".png"), c.file)
		}
	}
	fmt.Print(s.String())
	return benchdoc.WriteSection(path, "persist", s.String())
}

// loadavg is the 1-minute load average.
func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func cpus() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}

func mustCopyBundle(src, dst, id string) string {
	dir, err := benchcmd.CopyBundle(src, dst, id)
	if err != nil {
		benchexit.Fatal(err)
	}
	return dir
}
