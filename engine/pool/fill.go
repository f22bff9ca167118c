package pool

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/log"
)

// When and where a pool's filler runs: a detached hutch (Filler.Command),
// or a goroutine of a long-lived process (FillInProcess).

// fillHere: pools refill in goroutines of this process (FillInProcess).
var fillHere atomic.Bool

// FillInProcess makes pools that this process claims from refill in
// goroutines of its own rather than in a detached hutch: for a long-lived
// process such as hutch serve.
func FillInProcess() { fillHere.Store(true) }

// deferFills: detached fillers start late (DeferFills).
var deferFills atomic.Bool

// DeferFills makes the detached fillers that claims of this process
// start begin later: when the process calls StartFills, or shortly
// before the filler's delay ends, whichever is first. Starting a process
// costs the CPU the claimer's first command needs; a pool's refill does
// not start any later for it. A process that calls DeferFills calls
// StartFills before it exits.
func DeferFills() { deferFills.Store(true) }

// fillerStartup is how long before its delay ends a filler's hutch is
// started: about what a hutch process takes to start on a loaded host.
const fillerStartup = 50 * time.Millisecond

// deferred are the fillers waiting to be started, by pool directory.
var deferred struct {
	sync.Mutex
	m map[string]*deferredFill
}

type deferredFill struct {
	f     Filler
	name  string
	at    time.Time // when the filler is to start filling
	lock  *os.File  // the filler's shared lock of fillers.lock, held
	timer *time.Timer
}

// StartFills starts every filler DeferFills held back, each waiting for
// what is left of its delay, and returns once they are started.
func StartFills() {
	deferred.Lock()
	defer deferred.Unlock()
	for k, d := range deferred.m {
		d.timer.Stop()
		d.f.spawn(d.name, time.Until(d.at), d.lock)
		delete(deferred.m, k)
	}
}

// LockFD is the descriptor on which a detached filler inherits its shared
// lock of the pool's fillers.lock.
const LockFD = 3

// Filler is how the pools' fillers run.
type Filler struct {
	Pools Pools
	// Command starts a detached filler: with "--delay", a duration and
	// the pool's name after it, it waits that long and fills the pool,
	// holding the lock it inherits on LockFD.
	Command []string
	// FillAfter fills pool name after delay in this process (under
	// FillInProcess).
	FillAfter func(ctx context.Context, name string, delay time.Duration) error
}

// Kick starts pool name's filler in the background, after delay.
func (f Filler) Kick(name string, delay time.Duration) {
	if fillHere.Load() {
		go func() {
			if err := f.FillAfter(context.Background(), name, delay); err != nil {
				log.L.WithError(err).WithField("pool", name).Warn("filling pool")
			}
		}()
		return
	}
	// The filler holds fillers.lock shared from now on, through its
	// delay, so that pool rm waits for it: the lock is taken here and
	// handed down to it.
	lock, err := f.Pools.shareFillers(name)
	if err != nil {
		return // the pool is gone or being removed: nothing to refill
	}
	if !deferFills.Load() || delay <= fillerStartup {
		f.spawn(name, delay, lock)
		return
	}
	key := f.Pools.Dir(name)
	deferred.Lock()
	defer deferred.Unlock()
	if _, ok := deferred.m[key]; ok {
		// One filler fills the pool for every claim of this process.
		lock.Close()
		return
	}
	if deferred.m == nil {
		deferred.m = map[string]*deferredFill{}
	}
	d := &deferredFill{f: f, name: name, at: time.Now().Add(delay), lock: lock}
	d.timer = time.AfterFunc(delay-fillerStartup, func() {
		deferred.Lock()
		defer deferred.Unlock()
		if deferred.m[key] == d {
			delete(deferred.m, key)
			f.spawn(name, time.Until(d.at), lock)
		}
	})
	deferred.m[key] = d
}

// shell runs a detached filler's delay: a shell and sleep start in a
// fraction of what hutch takes, so that hutch starts only once its delay is
// nearly over, not while the claimer's first commands run.
var shell = sync.OnceValue(func() string {
	if _, err := os.Stat("/bin/sh"); err != nil {
		return ""
	}
	return "/bin/sh"
})

// spawn starts a detached filler that fills pool name after delay,
// handing it lock (fillers.lock) and closing this process's copy.
func (f Filler) spawn(name string, delay time.Duration, lock *os.File) {
	defer lock.Close()
	delay = max(delay, 0)
	fill := f.Command
	cmd := exec.Command(fill[0], append(append([]string{}, fill[1:]...), "--delay", delay.String(), name)...)
	if wait := delay - fillerStartup; wait > 0 && shell() != "" {
		// If sleep fails, the filler starts at once, without delay.
		cmd = exec.Command(shell(), append([]string{"-c", `sleep "$0"; exec "$@"`, fmt.Sprintf("%.3f", wait.Seconds())},
			append(append([]string{}, fill...), "--delay", "0s", name)...)...)
	}
	cmd.ExtraFiles = []*os.File{lock} // LockFD
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		log.L.WithError(err).WithField("pool", name).Warn("starting pool filler")
		return
	}
	// Reap it if it ends while we still run; it outlives us otherwise.
	go cmd.Wait() //nolint:errcheck
}
