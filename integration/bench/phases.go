package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The phases of a hutch command are found by handing hutch a shim as its
// runsc (`hutch --runsc SHIM`): this very program, which notes the time and
// the subcommand of each call and then becomes the real runsc. hutch passes
// runsc none of its own environment, so the shim is a link to this
// program in a directory of its own, beside a file naming the log and the
// real runsc.
const shimConf = "bench-shim.conf"

// shimConfig reads the shim's configuration if this program runs as the
// shim: the log path and the real runsc.
func shimConfig() (log, runsc string, ok bool) {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(os.Args[0]), shimConf))
	if err != nil {
		return "", "", false
	}
	f := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(f) != 2 {
		return "", "", false
	}
	return f[0], f[1], true
}

// runShim is main when this program runs as the shim.
func runShim(logPath, runsc string) {
	now := time.Now().UnixNano()
	if f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
		fmt.Fprintf(f, "%d %s\n", now, runscSubcommand(os.Args[1:]))
		f.Close()
	}
	err := syscall.Exec(runsc, append([]string{runsc}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "bench shim: exec %s: %v\n", runsc, err)
	os.Exit(125)
}

// runscSubcommand finds the subcommand among runsc's arguments.
func runscSubcommand(args []string) string {
	known := []string{"create", "start", "state", "exec", "delete", "kill", "run", "wait", "ps",
		"checkpoint", "restore", "tar", "events", "pause", "resume"}
	for _, a := range args {
		if slices.Contains(known, a) {
			return a
		}
	}
	return "?"
}

// phase is one part of a hutch command's time, over several runs.
type phase struct {
	name    string
	sub     string    // the runsc subcommand, empty for hutch's own start
	samples []float64 // seconds
}

// phaseSeries is a hutch command run through the shim, paired run by run
// with the same runsc calls made directly.
type phaseSeries struct {
	phases []phase
	// direct holds the direct runsc calls' times by subcommand, and
	// rawTotal what a runsc user would run instead of the hutch command.
	direct   map[string][]float64
	rawTotal []float64
}

func (s *phaseSeries) record(sub string, d time.Duration) {
	s.direct[sub] = append(s.direct[sub], d.Seconds())
}

// shim prepares the shim: its path and the environment that turns it on.
func (b *bench) shim() (path string, env []string, log string, err error) {
	path, err = os.Executable()
	if err != nil {
		return "", nil, "", err
	}
	log = b.tmp + "/shim.log"
	dir := filepath.Join(b.tmp, "shim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, "", err
	}
	link := filepath.Join(dir, "runsc")
	os.Remove(link)
	if err := os.Symlink(path, link); err != nil {
		return "", nil, "", err
	}
	if err := os.WriteFile(filepath.Join(dir, shimConf), []byte(log+"\n"+b.raw.runsc+"\n"), 0o644); err != nil {
		return "", nil, "", err
	}
	return link, b.env, log, nil
}

// phaseSeries runs n interleaved pairs of hutch (one run of `hutch --runsc
// SHIM ARGS...` per pair, through hutchRun) and raw (the direct runsc calls,
// recorded with s.record; keep is false in warm-up pairs).
func (b *bench) phaseSeries(ctx context.Context, name string,
	hutchRun func(ctx context.Context, s *phaseSeries, keep bool) error,
	raw func(ctx context.Context, s *phaseSeries, i int, keep bool) error) (*phaseSeries, error) {
	s := &phaseSeries{direct: map[string][]float64{}}
	_, _, err := b.interleave(ctx, name, b.cfg.warmup, b.cfg.n, pair{
		hutch: func(ctx context.Context, i int) (result, error) { return result{}, hutchRun(ctx, s, i >= 0) },
		raw:   func(ctx context.Context, i int) (result, error) { return result{}, raw(ctx, s, i, i >= 0) },
	})
	return s, err
}

// phased runs `hutch --runsc SHIM ARGS...` once and, if keep, adds its
// phases to s: hutch's own work before its first runsc call, then each
// call up to the next one (or to hutch's exit). It returns hutch's stdout.
func (b *bench) phased(ctx context.Context, s *phaseSeries, keep bool, args ...string) (string, error) {
	shim, env, log, err := b.shim()
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(log, nil, 0o600); err != nil {
		return "", err
	}
	r, err := timed(ctx, runOpts{env: env}, b.hutch, append([]string{"--runsc", shim}, args...)...)
	out := strings.TrimSpace(string(r.head))
	if err != nil {
		return out, err
	}
	calls, err := readShimLog(log)
	if err != nil || !keep {
		return out, err
	}
	end := r.start.Add(r.exit)
	names := []string{"hutch, before its first runsc call"}
	subs := []string{""}
	times := []float64{calls[0].at.Sub(r.start).Seconds()}
	for k, c := range calls {
		next := end
		if k+1 < len(calls) {
			next = calls[k+1].at
		}
		names = append(names, "`runsc "+c.sub+"`")
		subs = append(subs, c.sub)
		times = append(times, next.Sub(c.at).Seconds())
	}
	names[len(names)-1] += ", then hutch exits"
	if s.phases == nil {
		for k, name := range names {
			s.phases = append(s.phases, phase{name: name, sub: subs[k]})
		}
	}
	if len(names) != len(s.phases) {
		return out, fmt.Errorf("hutch %s made %d runsc calls, then %d", args[0], len(s.phases)-1, len(names)-1)
	}
	for k := range s.phases {
		if s.phases[k].name != names[k] {
			return out, fmt.Errorf("hutch %s made different runsc calls from run to run", args[0])
		}
		s.phases[k].samples = append(s.phases[k].samples, times[k])
	}
	return out, nil
}

// allPhases splits `hutch create` and `hutch rm` into phases,
// each paired with the runsc calls a runsc user would make instead.
func (b *bench) allPhases(ctx context.Context, rep *report) error {
	var err error
	rep.createPhases, err = b.phaseSeries(ctx, "phases of hutch create",
		func(ctx context.Context, s *phaseSeries, keep bool) error {
			id, err := b.phased(ctx, s, keep, "create")
			if id != "" {
				if _, rmErr := b.hutchCmd(ctx, "rm", "-f", id); err == nil {
					err = rmErr
				}
			}
			return err
		},
		func(ctx context.Context, s *phaseSeries, i int, keep bool) error {
			id := b.rawID("phase-create", i)
			res, err := b.raw.runDetached(ctx, id, b.raw.spec.Process.Args)
			if keep && err == nil {
				s.record("run", res.exit)
				s.rawTotal = append(s.rawTotal, res.exit.Seconds())
			}
			if _, rmErr := b.raw.remove(ctx, id); err == nil {
				err = rmErr
			}
			return err
		})
	if err != nil {
		return err
	}

	rep.rmPhases, err = b.phaseSeries(ctx, "phases of hutch rm",
		func(ctx context.Context, s *phaseSeries, keep bool) error {
			id, err := b.hutchCmd(ctx, "create")
			if err != nil {
				return err
			}
			_, err = b.phased(ctx, s, keep, "rm", "-f", id)
			return err
		},
		func(ctx context.Context, s *phaseSeries, i int, keep bool) error {
			id := b.rawID("phase-rm", i)
			_, err := b.raw.runDetached(ctx, id, b.raw.spec.Process.Args)
			r, rmErr := b.raw.remove(ctx, id)
			if err == nil {
				err = rmErr
			}
			if keep && err == nil {
				s.record("delete", r.exit)
				s.rawTotal = append(s.rawTotal, r.exit.Seconds())
			}
			return err
		})
	return err
}

type shimCall struct {
	at  time.Time
	sub string
}

func readShimLog(path string) ([]shimCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []shimCall
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ns, sub, ok := strings.Cut(sc.Text(), " ")
		t, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		calls = append(calls, shimCall{time.Unix(0, t), sub})
	}
	if len(calls) == 0 {
		return nil, fmt.Errorf("hutch made no runsc call through the shim")
	}
	return calls, sc.Err()
}

// shimCost is what the shim adds to one runsc call: `runsc state` of the
// target through the shim against directly, median difference.
func (b *bench) shimCost(ctx context.Context) (float64, error) {
	shim, env, _, err := b.shim()
	if err != nil {
		return 0, err
	}
	args := append(append([]string{}, b.targetGlobals...), "state", b.target)
	viaShim, direct, err := b.interleave(ctx, "shim cost", b.cfg.warmup, b.cfg.n, pair{
		hutch: func(ctx context.Context, i int) (result, error) { return timed(ctx, runOpts{env: env}, shim, args...) },
		raw:   func(ctx context.Context, i int) (result, error) { return timed(ctx, runOpts{}, b.raw.runsc, args...) },
	})
	if err != nil {
		return 0, err
	}
	return summarize(seconds(viaShim, exitTime)).median - summarize(seconds(direct, exitTime)).median, nil
}
