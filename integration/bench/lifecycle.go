package main

import (
	"context"
	"strings"
	"time"
)

// lifecycleRun is one pass of the lifecycle benchmark on one side: the
// whole `run`, then its steps one by one.
type lifecycleRun struct {
	// run is `hutch run --rm -- echo hi`, or `runsc run` of echo hi.
	run result
	// runDelete is the `runsc delete` after `runsc run`, zero if runsc
	// had already removed the container (raw side only).
	runDelete time.Duration
	// create is `hutch create`, or `runsc run --detach` of hutch's spec.
	create result
	// exec is a first `echo hi` into the sandbox just created.
	exec result
	// rm is `hutch rm -f`, or `runsc delete --force`.
	rm result
}

// lifecycle measures create-to-first-output and, in the same pairs, the
// steps of `hutch run` against their runsc counterparts, so that every
// number of the breakdown shares the machine's state with the headline.
func (b *bench) lifecycle(ctx context.Context, rep *report) error {
	var hutchRuns, rawRuns []lifecycleRun
	_, _, err := b.interleave(ctx, "run, and its steps", b.cfg.warmup, b.cfg.n, pair{
		hutch: func(ctx context.Context, i int) (result, error) {
			l, err := b.hutchLifecycle(ctx)
			if err == nil && i >= 0 {
				hutchRuns = append(hutchRuns, l)
			}
			return l.run, err
		},
		raw: func(ctx context.Context, i int) (result, error) {
			l, err := b.rawLifecycle(ctx, i)
			if err == nil && i >= 0 {
				rawRuns = append(rawRuns, l)
			}
			return l.run, err
		},
	})
	if err != nil {
		return err
	}
	both := func(f func(lifecycleRun) time.Duration) row {
		return row{summarize(lifecycleSeconds(hutchRuns, f)), summarize(lifecycleSeconds(rawRuns, f))}
	}
	rep.run = both(func(l lifecycleRun) time.Duration { return l.run.firstByte })
	rep.runCycle = both(func(l lifecycleRun) time.Duration { return l.run.exit + l.runDelete })
	rep.create = both(func(l lifecycleRun) time.Duration { return l.create.exit })
	rep.firstExec = both(func(l lifecycleRun) time.Duration { return l.exec.firstByte })
	rep.rm = both(func(l lifecycleRun) time.Duration { return l.rm.exit })
	for _, l := range rawRuns {
		if l.runDelete > 0 {
			rep.rawRunDeletes++
		}
	}
	return nil
}

func lifecycleSeconds(ls []lifecycleRun, f func(lifecycleRun) time.Duration) []float64 {
	out := make([]float64, len(ls))
	for i, l := range ls {
		out[i] = f(l).Seconds()
	}
	return out
}

// hutchLifecycle is the hutch side: `hutch run --rm -- echo hi`, then
// `hutch create`, `hutch exec ID -- echo hi` and `hutch rm -f ID`.
func (b *bench) hutchLifecycle(ctx context.Context) (lifecycleRun, error) {
	var l lifecycleRun
	var err error
	l.run, err = timed(ctx, runOpts{env: b.env}, b.hutch, "run", "--rm", "--", "echo", "hi")
	if l.run, err = expect(l.run, err, "hi\n"); err != nil {
		return l, err
	}
	if l.create, err = timed(ctx, runOpts{env: b.env}, b.hutch, "create"); err != nil {
		return l, err
	}
	id := strings.TrimSpace(string(l.create.head))
	l.exec, err = b.hutchExec(ctx, id, "echo", "hi")
	l.exec, err = expect(l.exec, err, "hi\n")
	var rmErr error
	l.rm, rmErr = timed(ctx, runOpts{env: b.env}, b.hutch, "rm", "-f", id)
	if err == nil {
		err = rmErr
	}
	return l, err
}

// rawLifecycle is the runsc side: `runsc run` of echo hi (and `runsc
// delete` if it leaves state), then `runsc run --detach` of
// hutch's spec with hutch-init as init, `runsc exec ID echo hi` and `runsc
// delete --force ID`.
func (b *bench) rawLifecycle(ctx context.Context, i int) (lifecycleRun, error) {
	var l lifecycleRun
	runID := b.rawID("run", i)
	r, err := b.raw.run(ctx, runID, []string{"echo", "hi"})
	l.run, err = expect(r, err, "hi\n")
	del, delErr := b.raw.remove(ctx, runID)
	l.runDelete = del.exit
	if err == nil {
		err = delErr
	}
	if err != nil {
		return l, err
	}

	id := b.rawID("steps", i)
	l.create, err = b.raw.runDetached(ctx, id, b.raw.spec.Process.Args)
	if err == nil {
		r, err = timed(ctx, runOpts{}, b.raw.runsc, append(b.raw.globals(id), "exec", id, "echo", "hi")...)
		l.exec, err = expect(r, err, "hi\n")
	}
	var rmErr error
	l.rm, rmErr = b.raw.remove(ctx, id)
	if err == nil {
		err = rmErr
	}
	return l, err
}
