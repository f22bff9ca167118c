package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// modes are the network modes measured; raw runsc runs in the first only.
var modes = []string{"none", "open"}

// series is one side's samples in one network mode, in seconds.
type series struct {
	// run: `hutch run --rm -- echo hi` (runsc: `runsc run`) to first
	// output. create: `hutch create` (runsc: `runsc run --detach`) to
	// exit. firstOut: from the start of create to the first byte of the
	// `echo hi` exec that follows it. exec: `exec true` to exit. rm:
	// `hutch rm -f` (runsc: `runsc delete --force`).
	run, create, firstOut, exec, rm []float64
}

// report is everything one run measured.
type report struct {
	cfg                config
	started            time.Time
	elapsed            time.Duration
	loadStart, loadEnd string
	machine            string
	user               string
	tunMode            os.FileMode
	tunChanged         bool
	// series by side ("root", "rootless", "runsc") and mode.
	series map[string]*series
	// phases of `hutch create` by side and mode.
	phases map[string]*phases
}

func key(side, mode string) string { return side + "/" + mode }

func (b *bench) measure(ctx context.Context) (*report, error) {
	rep := &report{cfg: b.cfg, started: time.Now(), loadStart: loadAvg(), machine: machine(),
		series: map[string]*series{}, phases: map[string]*phases{},
		user:    fmt.Sprintf("%s (uid %d, subordinate IDs %s)", benchUser, b.uid, b.subIDs),
		tunMode: b.tunMode, tunChanged: b.tunChanged}
	type step struct {
		name string
		f    func(ctx context.Context, s *series, i int) error
	}
	for i := -b.cfg.warm; i < b.cfg.n; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		passStart := time.Now()
		for _, mode := range modes {
			steps := []step{
				{"root", func(ctx context.Context, s *series, i int) error { return b.hutchPass(ctx, b.root, mode, s) }},
				{"rootless", func(ctx context.Context, s *series, i int) error { return b.hutchPass(ctx, b.rootless, mode, s) }},
			}
			if mode == "none" {
				steps = append(steps, step{"runsc", b.rawPass})
			}
			// Rotate the order from pass to pass.
			k := (i + b.cfg.warm) % len(steps)
			steps = append(steps[k:], steps[:k]...)
			for _, st := range steps {
				s := &series{}
				if i >= 0 {
					if rep.series[key(st.name, mode)] == nil {
						rep.series[key(st.name, mode)] = &series{}
					}
					s = rep.series[key(st.name, mode)]
				}
				if err := st.f(ctx, s, i); err != nil {
					return nil, fmt.Errorf("%s, --net %s: %w", st.name, mode, err)
				}
			}
		}
		if i < 0 {
			progress("warm-up pass %d in %s", i+b.cfg.warm+1, time.Since(passStart).Round(time.Millisecond))
		} else {
			progress("pass %d/%d in %s", i+1, b.cfg.n, time.Since(passStart).Round(time.Millisecond))
		}
	}
	if err := b.allPhases(ctx, rep); err != nil {
		return nil, err
	}
	rep.loadEnd = loadAvg()
	rep.elapsed = time.Since(rep.started)
	return rep, nil
}

// hutchPass is one pass of one hutch side: `hutch run --rm -- echo hi`, then
// `hutch create`, `hutch exec ID -- echo hi`, `hutch exec ID -- true` (several
// times) and `hutch rm -f ID`.
func (b *bench) hutchPass(ctx context.Context, s *hutchSide, mode string, ser *series) error {
	img := []string{"--image", "busybox", "--net", mode}
	r, err := s.timed(ctx, s.hutch, append(append([]string{"run", "--rm"}, img...), "--", "echo", "hi")...)
	if r, err = expect(r, err, "hi\n"); err != nil {
		return err
	}
	ser.run = append(ser.run, r.firstByte.Seconds())
	c, err := s.timed(ctx, s.hutch, append([]string{"create"}, img...)...)
	if err != nil {
		return err
	}
	id := strings.TrimSpace(c.out)
	err = func() error {
		e, err := s.timed(ctx, s.hutch, "exec", id, "--", "echo", "hi")
		e, err = expect(e, err, "hi\n")
		if err != nil {
			return err
		}
		var execs []float64
		for range b.cfg.execs {
			t, err := s.timed(ctx, s.hutch, "exec", id, "--", "true")
			if err != nil {
				return err
			}
			execs = append(execs, t.exit.Seconds())
		}
		ser.create = append(ser.create, c.exit.Seconds())
		ser.firstOut = append(ser.firstOut, e.start.Add(e.firstByte).Sub(c.start).Seconds())
		ser.exec = append(ser.exec, execs...)
		return nil
	}()
	rm, rmErr := s.timed(ctx, s.hutch, "rm", "-f", id)
	if err == nil {
		err = rmErr
	}
	if err == nil {
		ser.rm = append(ser.rm, rm.exit.Seconds())
	}
	return err
}

// rawPass is the runsc side of a pass: `runsc run` of echo hi, then
// `runsc run --detach` of root hutch's spec (hutch-init as init), `runsc exec
// ID echo hi`, `runsc exec ID true` (several times) and `runsc delete
// --force ID`.
func (b *bench) rawPass(ctx context.Context, ser *series, i int) error {
	r := b.raw
	runID := fmt.Sprintf("rbench-run-%d-%d", os.Getpid(), i+b.cfg.warm)
	res, err := r.run(ctx, runID, "echo", "hi")
	res, err = expect(res, err, "hi\n")
	if _, rmErr := r.remove(ctx, runID); err == nil {
		err = rmErr
	}
	if err != nil {
		return err
	}
	ser.run = append(ser.run, res.firstByte.Seconds())

	id := fmt.Sprintf("rbench-steps-%d-%d", os.Getpid(), i+b.cfg.warm)
	c, err := r.runDetached(ctx, id)
	if err == nil {
		err = func() error {
			e, err := r.exec(ctx, id, "echo", "hi")
			e, err = expect(e, err, "hi\n")
			if err != nil {
				return err
			}
			var execs []float64
			for range b.cfg.execs {
				t, err := r.exec(ctx, id, "true")
				if err != nil {
					return err
				}
				execs = append(execs, t.exit.Seconds())
			}
			ser.create = append(ser.create, c.exit.Seconds())
			ser.firstOut = append(ser.firstOut, e.start.Add(e.firstByte).Sub(c.start).Seconds())
			ser.exec = append(ser.exec, execs...)
			return nil
		}()
	}
	rm, rmErr := r.remove(ctx, id)
	if err == nil {
		err = rmErr
	}
	if err == nil {
		ser.rm = append(ser.rm, rm.exit.Seconds())
	}
	return err
}

// allPhases runs `hutch create` through the shims on both hutch sides, in
// both modes, taking the sides in turn.
func (b *bench) allPhases(ctx context.Context, rep *report) error {
	start := time.Now()
	for i := 0; i < b.cfg.phaseN; i++ {
		for _, mode := range modes {
			sides := []*hutchSide{b.root, b.rootless}
			if i%2 == 1 {
				sides[0], sides[1] = sides[1], sides[0]
			}
			for _, s := range sides {
				if err := b.phased(ctx, s, mode, rep); err != nil {
					return fmt.Errorf("phases of %s hutch create --net %s: %w", s.name, mode, err)
				}
			}
		}
	}
	progress("phases: %d passes in %s", b.cfg.phaseN, time.Since(start).Round(time.Millisecond))
	return nil
}

func (b *bench) phased(ctx context.Context, s *hutchSide, mode string, rep *report) error {
	if err := os.Truncate(s.shimLog, 0); err != nil {
		return err
	}
	shimmed := runner{env: s.shimEnv, cred: s.cred, dir: s.dir}
	r, err := shimmed.timed(ctx, s.hutch, "--runsc", filepath.Join(s.shimDir, "runsc"),
		"create", "--image", "busybox", "--net", mode)
	id := strings.TrimSpace(r.out)
	if id != "" {
		if _, rmErr := s.cmd(ctx, "rm", "-f", id); err == nil {
			err = rmErr
		}
	}
	if err != nil {
		return err
	}
	calls, err := readCalls(s.shimLog)
	if err != nil {
		return err
	}
	k := key(s.name, mode)
	if rep.phases[k] == nil {
		rep.phases[k] = &phases{}
	}
	if !rep.phases[k].add(r, calls) {
		var labels []string
		for _, c := range calls {
			labels = append(labels, c.label)
		}
		progress("%s --net %s: calls %q differ from the first run's, left out", s.name, mode, labels)
	}
	return nil
}
