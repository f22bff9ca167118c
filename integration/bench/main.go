// Command bench measures the sandbox lifecycle of hutch against raw runsc on
// the same machine, in one run, and writes the results as a section of a
// markdown report (docs/benchmarks.md).
//
// Every comparison runs the two sides interleaved (hutch, runsc, runsc, hutch,
// ...) so that they share the machine's noise. It needs root, the binaries
// of `make build`, and no network.
//
//	go run ./integration/bench -bin bin -out docs/benchmarks.md
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"hutch.dev/hutch/integration/bench/benchdoc"
)

// config is the command line.
type config struct {
	bin         string
	out         string
	n           int
	execN       int
	streamN     int
	memN        int
	warmup      int
	streamBytes int64
	settle      time.Duration
	// only, if "stream", runs the streaming exec alone and prints its
	// table, leaving -out alone.
	only string
	// command is how this run was invoked, for the report.
	command string
}

func main() {
	if log, runsc, ok := shimConfig(); ok {
		runShim(log, runsc)
		return
	}
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "directory holding hutch, hutch-init, runsc and images/busybox.tar")
	flag.StringVar(&c.out, "out", "", "markdown file whose lifecycle section is (re)written; empty: stdout only")
	flag.IntVar(&c.n, "n", 30, "measured runs per side for create/run benchmarks")
	flag.IntVar(&c.execN, "exec-n", 100, "measured runs per side for exec benchmarks")
	flag.IntVar(&c.streamN, "stream-n", 3, "measured runs per side for the streaming exec (no warm-up: it follows the exec benchmarks)")
	flag.IntVar(&c.memN, "mem-n", 3, "idle sandboxes measured per side")
	flag.IntVar(&c.warmup, "warmup", 2, "untimed runs per side before each benchmark")
	flag.Int64Var(&c.streamBytes, "stream-bytes", 1<<30, "bytes written to stdout by the streaming exec")
	flag.DurationVar(&c.settle, "settle", time.Second, "wait after starting an idle sandbox before reading its memory")
	flag.StringVar(&c.only, "only", "", `"stream": run only the streaming exec (after creating its sandbox) and print its table, writing no file`)
	flag.Parse()
	if flag.NArg() != 0 || (c.only != "" && c.only != "stream") || c.n < 1 || c.execN < 1 || c.streamN < 1 || c.memN < 1 || c.warmup < 0 || c.streamBytes < 1 {
		flag.Usage()
		os.Exit(2)
	}
	c.command = invocation()
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func run(c config) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: both sides use cgroups and runsc's rootful mode")
	}
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		return err
	}
	c.bin = bin
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := newBench(c)
	if err != nil {
		if b != nil {
			b.cleanup()
		}
		return err
	}
	if c.only == "stream" {
		res, err := b.measureStream(ctx)
		b.cleanup()
		if err != nil {
			return err
		}
		fmt.Print(renderStream(res))
		return nil
	}
	res, err := b.measure(ctx)
	b.cleanup()
	if err != nil {
		return err
	}
	section := render(res)
	fmt.Print(section)
	if c.out == "" {
		return nil
	}
	if err := benchdoc.WriteSection(c.out, "lifecycle", section); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", c.out)
	return nil
}

// progress reports what the benchmark is doing, on stderr.
func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
}

// invocation is the command line of this run as the report shows it:
// `make bench` when only the flags that the Makefile passes were given.
func invocation() string {
	args := []string{"go", "run", "./integration/bench"}
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
		case "out":
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
