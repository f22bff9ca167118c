package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"sort"
	"strings"
	"syscall"
	"time"
)

// cmdTimeout bounds any single command the benchmark runs.
const cmdTimeout = 2 * time.Minute

// result is one timed command.
type result struct {
	start time.Time
	// firstByte is from just before fork to the first byte read from
	// stdout (zero if none came); exit is to the process's reaping.
	firstByte, exit time.Duration
	out             string
}

// runner runs commands as one user with one environment.
type runner struct {
	env  []string
	cred *syscall.Credential
	dir  string
}

// timed runs path args with stdout on a pipe read to the end, timing the
// first byte and the exit. Stderr goes to a file (a pipe could be held
// open by a sandbox) and comes back in the error of a failed run.
func (r runner) timed(ctx context.Context, path string, args ...string) (result, error) {
	return r.timedOut(ctx, true, path, args...)
}

// timedOut is timed, with stdout on /dev/null unless pipe.
func (r runner) timedOut(ctx context.Context, pipe bool, path string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	errf, err := os.CreateTemp("", "hutch-rbench-stderr-")
	if err != nil {
		return result{}, err
	}
	defer os.Remove(errf.Name())
	defer errf.Close()
	var pr, pw *os.File
	if pipe {
		if pr, pw, err = os.Pipe(); err != nil {
			return result{}, err
		}
	} else if pw, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0); err != nil {
		return result{}, err
	}
	if pr != nil {
		defer pr.Close()
	}

	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env, cmd.Dir = r.env, r.dir
	cmd.Stdout, cmd.Stderr = pw, errf
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		pw.Close()
		return result{}, err
	}
	pw.Close()
	first := make(chan time.Duration, 1)
	read := make(chan []byte, 1)
	if pr == nil {
		close(first)
		read <- nil
	} else {
		go readAll(pr, start, first, read)
	}
	werr := cmd.Wait()
	res := result{start: start, exit: time.Since(start)}
	if pr != nil {
		// A process the command left behind may still hold the pipe.
		pr.SetReadDeadline(time.Now().Add(500 * time.Millisecond)) //nolint:errcheck // best effort
	}
	res.out = string(<-read)
	select {
	case res.firstByte = <-first:
	default:
	}
	if werr != nil {
		msg, _ := os.ReadFile(errf.Name())
		return res, fmt.Errorf("%s %s: %w: %s", path, strings.Join(args, " "), werr, bytes.TrimSpace(msg))
	}
	return res, nil
}

// readAll reads f to EOF or its deadline, sending when the first byte
// came and then everything read.
func readAll(f *os.File, start time.Time, first chan<- time.Duration, read chan<- []byte) {
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if len(out) == 0 {
				first <- time.Since(start)
			}
			out = append(out, buf[:n]...)
		}
		if err != nil {
			break
		}
	}
	read <- out
}

// expect checks a run's stdout.
func expect(r result, err error, want string) (result, error) {
	if err == nil && r.out != want {
		err = fmt.Errorf("output %q, want %q", r.out, want)
	}
	return r, err
}

// stats summarizes samples in seconds.
type stats struct {
	n           int
	median, p95 float64
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
	// p95 by nearest rank.
	return stats{n: n, median: med, p95: s[int(math.Ceil(0.95*float64(n)))-1]}
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
