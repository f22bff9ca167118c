// Command images measures hutch's image builds and writes them into the
// images section of docs/benchmarks.md:
//
//	go run ./integration/bench/images -bin bin -out docs/benchmarks.md
//
// It needs root, the built bin/ (make build base-rootfs) and Debian's
// package mirror (mmdebstrap). Every root it uses is fresh and removed.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"hutch.dev/hutch/integration/bench/benchdoc"
)

func main() {
	bin := flag.String("bin", "bin", "directory of the built hutch binaries")
	out := flag.String("out", "docs/benchmarks.md", "benchmarks file to update")
	flag.Parse()
	if err := run(*bin, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench images:", err)
		os.Exit(1)
	}
}

type hutch struct {
	bin, root string
}

func (s hutch) run(args ...string) (time.Duration, string, error) {
	c := exec.Command(filepath.Join(s.bin, "hutch"), args...)
	c.Env = append(os.Environ(), "HUTCH_ROOT="+s.root)
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	start := time.Now()
	err := c.Run()
	d := time.Since(start)
	if err != nil {
		return d, "", fmt.Errorf("hutch %s: %v: %s", strings.Join(args, " "), err, lastLines(e.String(), 5))
	}
	return d, o.String(), nil
}

// stop stops the root's buildkitd and removes the root.
func (s hutch) cleanup() {
	if b, err := os.ReadFile(filepath.Join(s.root, "buildkit", "supervisor.pid")); err == nil {
		var pid int
		fmt.Sscan(string(b), &pid)
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	os.RemoveAll(s.root)
}

func run(binDir, out string) error {
	binDir, err := filepath.Abs(binDir)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "hutch-bench-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// hutch without the prebuilt Debian rootfs beside it: the first run
	// installs Debian with mmdebstrap, as on a fresh machine.
	bare := filepath.Join(work, "bin")
	os.MkdirAll(filepath.Join(bare, "images"), 0o755)
	for _, f := range []string{"hutch", "hutch-init", "runsc", "buildkitd", "hutch-buildkitd", "hutch-buildkit-runtime", "images/busybox.tar"} {
		if err := copyFile(filepath.Join(binDir, f), filepath.Join(bare, f)); err != nil {
			return err
		}
	}
	cold := hutch{bin: bare, root: filepath.Join(work, "cold")}
	defer cold.cleanup()
	fmt.Fprintln(os.Stderr, "cold build of base (mmdebstrap + BuildKit)...")
	tCold, _, err := cold.run("run", "--rm", "--", "true")
	if err != nil {
		return err
	}
	cold.cleanup()

	warm := hutch{bin: binDir, root: filepath.Join(work, "warm")}
	defer warm.cleanup()
	fmt.Fprintln(os.Stderr, "build of base from the prebuilt rootfs archive...")
	tArchive, _, err := warm.run("run", "--rm", "--", "true")
	if err != nil {
		return err
	}
	ctxDir, err := filepath.Abs("buildimg/base")
	if err != nil {
		return err
	}
	const n = 5
	var cached []time.Duration
	for i := 0; i < n; i++ {
		d, _, err := warm.run("image", "build", "--progress", "quiet", "-t", "base", ctxDir)
		if err != nil {
			return err
		}
		cached = append(cached, d)
	}
	warm.stopDaemon()
	tDaemonCold, _, err := warm.run("image", "build", "--progress", "quiet", "-t", "base", ctxDir)
	if err != nil {
		return err
	}
	_, ls, err := warm.run("image", "ls", "--format", "json")
	if err != nil {
		return err
	}
	var imgs []struct {
		Name string
		Size int64
	}
	json.Unmarshal([]byte(ls), &imgs)
	var size int64
	for _, i := range imgs {
		if i.Name == "base:latest" {
			size = i.Size
		}
	}
	var imgsChain []struct {
		Name    string
		ChainID string
	}
	json.Unmarshal([]byte(ls), &imgsChain)
	var kib int64
	for _, i := range imgsChain {
		if i.Name == "base:latest" {
			// The unpacked rootfs every sandbox on base shares.
			du, err := exec.Command("du", "-sk", filepath.Join(warm.root, "images", "rootfs", strings.TrimPrefix(i.ChainID, "sha256:"))).Output()
			if err != nil {
				return fmt.Errorf("du of base's rootfs: %w", err)
			}
			fmt.Sscan(string(du), &kib)
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "### Images\n\n")
	fmt.Fprintf(&b, "`go run ./integration/bench/images` (part of `make bench`), %s, 2 cores. Base is Debian bookworm with python3, nodejs, npm, git, curl and build-essential.\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "| what | time |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| cold base build: first `hutch run` on a fresh host (mmdebstrap from Debian's mirror, then BuildKit, RUN under gVisor) | %s |\n", tCold.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "| first `hutch run` with the Debian rootfs prebuilt by `make base-rootfs` (import + BuildKit) | %s |\n", tArchive.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "| cached rebuild of buildimg/base, buildkitd running (median of %d) | %s |\n", n, median(cached).Round(time.Millisecond))
	fmt.Fprintf(&b, "| cached rebuild of buildimg/base, buildkitd stopped first (includes its start) | %s |\n", tDaemonCold.Round(time.Millisecond))
	fmt.Fprintf(&b, "\n| base image size | |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| compressed (blobs in the store) | %.1f MiB |\n", float64(size)/(1<<20))
	fmt.Fprintf(&b, "| unpacked root filesystem, shared by its sandboxes (`du -sk`) | %.1f MiB |\n", float64(kib)/1024)
	return benchdoc.WriteSection(out, "images", b.String())
}

func (s hutch) stopDaemon() {
	if b, err := os.ReadFile(filepath.Join(s.root, "buildkit", "supervisor.pid")); err == nil {
		var pid int
		fmt.Sscan(string(b), &pid)
		if pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, _ := in.Stat()
	os.MkdirAll(filepath.Dir(dst), 0o755)
	o, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	defer o.Close()
	_, err = io.Copy(o, in)
	return err
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}
