package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cmdTimeout bounds any single command the benchmark runs.
const cmdTimeout = 2 * time.Minute

// result is one timed command.
type result struct {
	// start is when the command was about to be forked.
	start time.Time
	// firstByte is the time from just before fork until the first byte
	// of stdout was read (zero if there was no output).
	firstByte time.Duration
	// exit is the time from just before fork until the process was reaped.
	exit time.Duration
	// bytes counts stdout; head holds its first bytes.
	bytes int64
	head  []byte
	// maxRSS is getrusage's ru_maxrss of the child, in bytes: the largest
	// resident set of the child and of the descendants it waited for.
	maxRSS int64
	// cpu is the child's CPU time, user and system, from getrusage.
	cpu time.Duration
	// hwm is the child's own peak resident set (VmHWM), in bytes, sampled
	// from /proc while it ran (zero unless asked for).
	hwm int64
}

// runOpts say how to run a timed command.
type runOpts struct {
	env []string
	// discardStdout gives the command /dev/null instead of a pipe: for
	// commands that leave daemons behind holding their stdout (runsc
	// create), whose pipe would never see EOF.
	discardStdout bool
	// sampleHWM polls the child's VmHWM while it runs.
	sampleHWM bool
}

// timed runs name args with stdout on a pipe that it reads to the end,
// timing the first byte and the exit. Stderr goes to a file (a pipe could
// be held open by a sandbox) and is returned in the error of a failed run.
func timed(ctx context.Context, o runOpts, name string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	errf, err := os.CreateTemp("", "hutch-bench-stderr-")
	if err != nil {
		return result{}, err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()

	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = o.env
	cmd.Stderr = errf
	var pr, pw *os.File
	if o.discardStdout {
		devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
		if err != nil {
			return result{}, err
		}
		defer devnull.Close()
		cmd.Stdout = devnull
	} else {
		if pr, pw, err = os.Pipe(); err != nil {
			return result{}, err
		}
		defer pr.Close()
		cmd.Stdout = pw
	}

	start := time.Now()
	if err := cmd.Start(); err != nil {
		if pw != nil {
			pw.Close()
		}
		return result{}, err
	}
	var (
		first    = make(chan time.Duration, 1)
		readDone = make(chan result, 1)
	)
	if pr != nil {
		pw.Close()
		go readAll(pr, start, first, readDone)
	} else {
		readDone <- result{}
	}
	hwmDone := make(chan int64, 1)
	stopHWM := make(chan struct{})
	if o.sampleHWM {
		go sampleHWM(cmd.Process.Pid, stopHWM, hwmDone)
	} else {
		hwmDone <- 0
	}

	werr := cmd.Wait()
	exit := time.Since(start)
	close(stopHWM)
	if pr != nil {
		// A process the command left behind may still hold the pipe.
		pr.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck // best effort
	}
	r := <-readDone
	r.start, r.exit = start, exit
	r.hwm = <-hwmDone
	select {
	case r.firstByte = <-first:
	default:
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSS = ru.Maxrss * 1024
		r.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if werr != nil {
		msg, _ := os.ReadFile(errf.Name())
		return r, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), werr, bytes.TrimSpace(msg))
	}
	return r, nil
}

// readAll reads f to EOF (or its deadline), reporting when the first byte
// arrived and how much came.
func readAll(f *os.File, start time.Time, first chan<- time.Duration, done chan<- result) {
	const keep = 4096
	var r result
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if r.bytes == 0 {
				first <- time.Since(start)
			}
			r.bytes += int64(n)
			if len(r.head) < keep {
				r.head = append(r.head, buf[:min(n, keep-len(r.head))]...)
			}
		}
		if err != nil {
			break
		}
	}
	done <- r
}

// sampleHWM polls /proc/PID/status for VmHWM until stop, and sends the
// largest value seen. VmHWM only grows, so the last sample before the
// process exits is its peak to within the polling interval.
func sampleHWM(pid int, stop <-chan struct{}, done chan<- int64) {
	var peak int64
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if v, err := statusField(pid, "VmHWM"); err == nil && v > peak {
			peak = v
		}
		select {
		case <-stop:
			done <- peak
			return
		case <-t.C:
		}
	}
}

// statusField reads a "kB" field of /proc/PID/status, in bytes.
func statusField(pid int, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return kBField(b, field)
}

// kBField finds "FIELD:   123 kB" in a /proc file and returns it in bytes.
func kBField(b []byte, field string) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != field {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, err
		}
		return n * 1024, nil
	}
	return 0, fmt.Errorf("no %s", field)
}

// hostMemory is what the host processes of one sandbox hold.
type hostMemory struct {
	procs    int
	pss, rss int64
}

// sandboxMemory sums PSS and RSS over the processes whose command line
// names id (runsc's sandbox and gofer processes) and all their
// descendants (systrap's stub processes, which have no command line).
func sandboxMemory(id string) (hostMemory, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return hostMemory{}, err
	}
	parent := map[int]int{}
	var roots []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, err := ppid(pid); err == nil {
			parent[pid] = pp
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cl, []byte(id)) {
			roots = append(roots, pid)
		}
	}
	if len(roots) == 0 {
		return hostMemory{}, fmt.Errorf("no host process names sandbox %s", id)
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	// Add descendants until nothing changes (the tree is shallow).
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if !in[pid] && in[pp] {
				in[pid] = true
				changed = true
			}
		}
	}
	var m hostMemory
	for pid := range in {
		rollup, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // exited meanwhile
			}
			return m, err
		}
		pss, err := kBField(rollup, "Pss")
		if err != nil {
			return m, fmt.Errorf("pid %d: %w", pid, err)
		}
		rss, err := statusField(pid, "VmRSS")
		if err != nil {
			return m, fmt.Errorf("pid %d: %w", pid, err)
		}
		m.procs++
		m.pss += pss
		m.rss += rss
	}
	return m, nil
}

// ppid is field 4 of /proc/PID/stat.
func ppid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	return strconv.Atoi(f[1])
}
