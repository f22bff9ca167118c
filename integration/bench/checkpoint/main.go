// Command checkpoint measures hutch's checkpoints beside raw runsc: a
// checkpoint and a restore in place of a sandbox with memory in use, a
// checkpoint after a small change among many files, and the disk of ten
// checkpoints against ten independent ones and ten snapshots. It writes
// its section of docs/benchmarks.md.
//
//	go run ./integration/bench/checkpoint -bin bin -out docs/benchmarks.md
//
// It needs root and the built binaries in -bin. Everything it creates
// lives in a temporary state root, removed at the end.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
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
	runs      int
	load0     string
	rows      [][]string
	notes     []string
}

func main() {
	bin := flag.String("bin", "bin", "directory with hutch, hutch-init, runsc and images/")
	out := flag.String("out", "docs/benchmarks.md", "markdown file to update")
	runs := flag.Int("runs", 3, "repetitions of each measurement (median reported)")
	mib := flag.Int("mib", 512, "MiB of memory in use in the sandbox checkpointed")
	filesMiB := flag.Int("files-mib", 1024, "MiB of files in the sandbox changed by 1 MiB")
	only := flag.String("only", "memory,files,disk", "comma-separated measurements to run")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		benchexit.Fatal(err)
	}
	root, err := os.MkdirTemp("", "hutch-bench-checkpoint-")
	if err != nil {
		benchexit.Fatal(err)
	}
	b := &bench{bin: abs, root: root, runs: *runs, load0: loadavg()}
	defer b.cleanup()
	benchexit.AtExit(b.cleanup)
	want := map[string]bool{}
	for _, m := range strings.Split(*only, ",") {
		want[strings.TrimSpace(m)] = true
	}
	if want["memory"] {
		b.memory(*mib)
	}
	if want["files"] {
		b.files(*filesMiB)
	}
	if want["disk"] {
		b.disk(*mib / 2)
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
	if len(args) > 0 && args[0] == "create" {
		args = append([]string{"create", "--image", "busybox"}, args[1:]...)
	}
	c := exec.Command(filepath.Join(b.bin, "hutch"), args...)
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

func (b *bench) timed(args ...string) (time.Duration, string) {
	start := time.Now()
	out := b.must(args...)
	return time.Since(start), out
}

// settle waits until no detached hutch of this root runs (a storer of
// checkpoints, the removal of a used one) and dirty pages are written
// back, so that each timed command starts on a quiet host.
func (b *bench) settle() {
	for deadline := time.Now().Add(120 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if !b.detachedRunning() {
			syscall.Sync()
			return
		}
	}
	benchexit.Fatal(fmt.Errorf("detached hutch processes still run after 120s"))
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

// runsc runs the pinned runsc with the global flags hutch gives sandbox
// dir's sandbox.
func (b *bench) runsc(dir string, args ...string) time.Duration {
	full := append([]string{
		"--root", filepath.Join(b.root, "runsc"), "--network=none", "--gofer-network-namespace=new",
		fmt.Sprintf("--overlay2=root:dir=%s,size=%d", dir, int64(10)<<30),
	}, args...)
	c := exec.Command(filepath.Join(b.bin, "runsc"), full...)
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

type checkpointInfo struct {
	ID           string `json:"id"`
	MemorySize   int64  `json:"memorySize"`
	MemoryStored int64  `json:"memoryStored"`
	FilesSize    int64  `json:"filesSize"`
	FilesStored  int64  `json:"filesStored"`
}

func (b *bench) checkpoints(id string) map[string]checkpointInfo {
	var cks []checkpointInfo
	if err := json.Unmarshal([]byte(b.must("checkpoint", "ls", "--format", "json", id)), &cks); err != nil {
		benchexit.Fatal(err)
	}
	out := map[string]checkpointInfo{}
	for _, c := range cks {
		out[c.ID] = c
	}
	return out
}

// memory: checkpoint and restore in place with mib MiB in use, beside
// runsc checkpoint and runsc restore of the same sandbox.
func (b *bench) memory(mib int) {
	id := b.must("create", "--memory", fmt.Sprintf("%dm", mib+512))
	b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/resident", mib<<20))
	b.must("exec", "-d", id, "--", "sh", "-c", "while true; do sleep 1; done")
	dir := filepath.Join(b.root, "sandboxes", id)
	var ck, restore, restoreOld, rawCk, rawRestore []time.Duration
	var first string
	for i := 0; i < b.runs; i++ {
		b.settle()
		d, c := b.timed("checkpoint", id)
		ck = append(ck, d)
		if first == "" {
			first = c
		}
		b.settle()
		d, _ = b.timed("restore", id, c)
		restore = append(restore, d)
		// An older checkpoint: its memory is rebuilt from its chunks.
		if c != first {
			b.settle()
			d, _ = b.timed("restore", id, first)
			restoreOld = append(restoreOld, d)
		}

		img := filepath.Join(b.root, "raw-ck")
		os.MkdirAll(img, 0o700)
		b.settle()
		rawCk = append(rawCk, b.runsc(dir, "checkpoint", "--leave-running", "--image-path", img, id))
		rawID := fmt.Sprintf("bench-raw-%d", i)
		rawDir := filepath.Join(b.root, rawID)
		bundle := mustCopyBundle(filepath.Join(dir, "bundle"), filepath.Join(rawDir, "bundle"), rawID)
		b.settle()
		rawRestore = append(rawRestore, b.runsc(rawDir, "restore", "--detach", "--bundle", bundle, "--image-path", img, rawID))
		b.runsc(rawDir, "delete", "--force", rawID)
		os.RemoveAll(img)
		os.RemoveAll(rawDir)
	}
	b.settle()
	cks := b.checkpoints(id)
	var stored []string
	for _, c := range cks {
		stored = append(stored, fmt.Sprintf("%.0f%%", 100*float64(c.MemoryStored)/float64(max(c.MemorySize, 1))))
	}
	sort.Strings(stored)
	b.row(fmt.Sprintf("checkpoint, %d MiB in use", mib), ms(benchcmd.Median(ck)), ms(benchcmd.Median(rawCk))+" (`runsc checkpoint --leave-running`)",
		ratio(benchcmd.Median(ck), benchcmd.Median(rawCk))+"; hutch adds the files layer (`runsc tar rootfs-upper`) and the record; checksums and chunks follow in a detached process")
	b.row(fmt.Sprintf("restore in place to the current checkpoint, %d MiB in use", mib), ms(benchcmd.Median(restore)), ms(benchcmd.Median(rawRestore))+" (`runsc restore` into a new container)",
		ratio(benchcmd.Median(restore), benchcmd.Median(rawRestore))+"; hutch adds killing the running sandbox, verifying the checkpoint (XXH64) and its network and cgroup again")
	if len(restoreOld) > 0 {
		b.row(fmt.Sprintf("restore in place to an older checkpoint, %d MiB in use", mib), ms(benchcmd.Median(restoreOld)), ms(benchcmd.Median(rawRestore)),
			ratio(benchcmd.Median(restoreOld), benchcmd.Median(rawRestore))+"; its memory is made whole again from its chunks (SHA-256 of each) first")
	}
	b.notes = append(b.notes, fmt.Sprintf("Memory each of the %d checkpoints of the %d MiB sandbox added to the chunk store, as a share of its size: %s (the first holds everything; each later one, of a sandbox that changed little, only its new chunks).",
		len(cks), mib, strings.Join(stored, ", ")))
	b.must("rm", "-f", id)
}

// files: a checkpoint after a 1 MiB change in a sandbox with mib MiB of
// files, in its image (a snapshot's) and written in the sandbox.
func (b *bench) files(mib int) {
	src := b.must("create", "--memory", "512m")
	b.must("exec", src, "--", "sh", "-c", fmt.Sprintf("mkdir /data && for i in $(seq 1 %d); do head -c 16777216 /dev/urandom > /data/f$i; done", mib/16))
	b.must("snapshot", "-t", "files", src)
	b.must("rm", "-f", src)
	for _, where := range []string{"image", "sandbox"} {
		var id string
		if where == "image" {
			id = b.must("create", "--image", "files", "--memory", "512m")
		} else {
			id = b.must("create", "--memory", fmt.Sprintf("%dm", mib+1024))
			b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("mkdir /data && for i in $(seq 1 %d); do head -c 16777216 /dev/urandom > /data/f$i; done", mib/16))
		}
		b.must("exec", "-d", id, "--", "sh", "-c", "while true; do sleep 1; done")
		b.settle()
		_, c0 := b.timed("checkpoint", id)
		var ds []time.Duration
		var last string
		for i := 0; i < b.runs; i++ {
			b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c 1048576 /dev/urandom > /data/change%d", i))
			b.settle()
			d, c := b.timed("checkpoint", id)
			ds = append(ds, d)
			last = c
		}
		var raw []time.Duration
		for i := 0; i < b.runs; i++ {
			img := filepath.Join(b.root, "raw-ck")
			os.MkdirAll(img, 0o700)
			b.settle()
			raw = append(raw, b.runsc(filepath.Join(b.root, "sandboxes", id), "checkpoint", "--leave-running", "--image-path", img, id))
			os.RemoveAll(img)
		}
		b.settle()
		cks := b.checkpoints(id)
		first, l := cks[c0], cks[last]
		b.row(fmt.Sprintf("checkpoint after a 1 MiB change, %d MiB of files in the %s", mib, where), ms(benchcmd.Median(ds)),
			ms(benchcmd.Median(raw))+" (`runsc checkpoint --leave-running`, memory only)",
			fmt.Sprintf("%s; files layer %s, of which %s new to the store (the first checkpoint's %s, %s new); memory %s, %s new (the first's %s new)",
				ratio(benchcmd.Median(ds), benchcmd.Median(raw)), mib1(l.FilesSize), mib1(l.FilesStored), mib1(first.FilesSize), mib1(first.FilesStored),
				mib1(l.MemorySize), mib1(l.MemoryStored), mib1(first.MemoryStored)))
		b.must("rm", "-f", id)
	}
	b.notes = append(b.notes, "A checkpoint's files are the sandbox's changes to its image, one layer cut into the store's chunks: files that came with the image are never in it; files written in the sandbox are in every checkpoint's layer but stored once, as chunks, and so is their copy in the memory, where gVisor keeps its writable layer. Their export (`runsc tar rootfs-upper`) and gVisor's checkpoint of that memory still read all of them at every checkpoint: the time grows with the files written in the sandbox, the disk does not.")
}

// disk: ten checkpoints of a sandbox with mib MiB in use and a small
// change between each, against ten independent checkpoints (what ten
// pauses store) and ten snapshots.
func (b *bench) disk(mib int) {
	id := b.must("create", "--memory", fmt.Sprintf("%dm", mib+512))
	b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/resident && mkdir /work", mib<<20))
	b.must("exec", "-d", id, "--", "sh", "-c", "while true; do sleep 1; done")
	before := b.storeBytes()
	var independent int64
	for i := 0; i < 10; i++ {
		b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c 65536 /dev/urandom > /work/step%d", i))
		c := b.must("checkpoint", "-m", fmt.Sprintf("step %d", i), id)
		b.settle()
		independent += b.checkpoints(id)[c].MemorySize
	}
	b.settle()
	ckDisk := b.storeBytes() - before
	before = b.storeBytes()
	for i := 0; i < 10; i++ {
		b.must("exec", id, "--", "sh", "-c", fmt.Sprintf("head -c 65536 /dev/urandom > /work/snap%d", i))
		b.must("snapshot", "-t", fmt.Sprintf("snap%d", i), id)
	}
	snapDisk := b.storeBytes() - before
	b.row(fmt.Sprintf("disk of 10 checkpoints, %d MiB in use, 64 KiB written between each", mib), mib1(ckDisk), "",
		fmt.Sprintf("10 independent memory checkpoints (as 10 pauses keep them) hold %s: %.1fx; 10 snapshots (files only, no memory) %s", mib1(independent), float64(independent)/float64(max(ckDisk, 1)), mib1(snapDisk)))
	b.must("rm", "-f", id)
}

// storeBytes is the disk the image store holds: blobs, checkpoints and
// chunks.
func (b *bench) storeBytes() int64 {
	var n int64
	for _, d := range []string{"oci", "checkpoints", "chunks"} {
		filepath.WalkDir(filepath.Join(b.root, "images", d), func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if fi, err := e.Info(); err == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); ok {
						n += st.Blocks * 512
					}
				}
			}
			return nil
		})
	}
	return n
}

func ratio(h, raw time.Duration) string {
	return fmt.Sprintf("%.2fx raw", float64(h)/float64(max(raw, 1)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

func mib1(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func (b *bench) row(op, hutch, raw, note string) {
	b.rows = append(b.rows, []string{op, hutch, raw, note})
	fmt.Fprintf(os.Stderr, "%s: %s | %s | %s\n", op, hutch, raw, note)
}

func (b *bench) write(path string) error {
	var s strings.Builder
	s.WriteString("## Checkpoints: checkpoint, restore in place, disk\n\n")
	fmt.Fprintf(&s, "Produced by `make bench` (`go run ./integration/bench/checkpoint -bin bin -out docs/benchmarks.md`) on %s (load average (1 min) at start %s, at end %s: the machine is shared); wall time of each command, median of %d runs, on the busybox image, each on a settled host (no detached hutch of the previous step running, dirty pages written back). Raw runsc is the runsc `make` builds, with the flags and bundle hutch uses.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), b.load0, loadavg(), b.runs)
	s.WriteString("| operation | hutch | raw runsc | note |\n| --- | --- | --- | --- |\n")
	for _, r := range b.rows {
		s.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	for _, n := range b.notes {
		s.WriteString("\n" + n + "\n")
	}
	fmt.Print(s.String())
	return benchdoc.WriteSection(path, "checkpoint", s.String())
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func mustCopyBundle(src, dst, id string) string {
	dir, err := benchcmd.CopyBundle(src, dst, id)
	if err != nil {
		benchexit.Fatal(err)
	}
	return dir
}
